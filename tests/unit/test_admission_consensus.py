"""admission-consensus: a rank with less free memory no longer resumes, admits or moves on requests alone.

Reproduced on a real gloo group (tests/repro/admission.py) with SGLang 0.5.23's own
`DecodePreallocQueue.resume_retracted_reqs`, token budget and allocator checks: every rank holds the same three
retracted requests; the last rank has room for two. Unpatched, it resumes two while its peers resume three: the
ranks decode different batches from then on, and that rank alone still holds a retracted request (the retraction
gate's input: without `kv-poll-lockstep` the decode polls hang on it, as test_desync_reproduction shows). Patched,
every rank agrees the smallest free capacity first and resumes the same two, keeping its own surplus.

Prefill admission (tests/repro/prefill.py with tests/repro/prefill_admission.py: SGLang's own
`get_new_batch_prefill`, `PrefillAdder` and budget over a real radix cache and allocator): three requests arrive
together; the last rank has room for two. Unpatched the group desyncs; with `kv-poll-lockstep` alone the batches
differ and the third request is lost; agreed, every rank prefills the same two and drops nothing.

Prefill bootstrap (tests/repro/prefill.py, SGLang's own `pop_bootstrapped`, `ensure_metadata_buffer` and metadata
allocator): two requests that may be prefilled before their bootstrap completes arrive together; the last rank has
one free metadata buffer, its peers plenty. With `kv-poll-lockstep` alone, the last rank moves one on and keeps the
other, its peers move both: the lockstep then fails the second on every rank (no rank can complete it), a request
lost to one rank's scarcity. With `admission-consensus` too, every rank agrees no buffer is free for the second,
keeps it, and nothing is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches import base, registry, targets
from pdfleet.runtime.patches.impl import admission_consensus as ac
from tests.repro import admission, group
from tests.repro.scenario import SGLANG_VERSION, Scenario
from tests.support import patched_sglang, requires

FIXES = ("kv-poll-lockstep", "abort-consensus", "health-check-consensus", "retraction-consensus", ac.PATCH_ID)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Any]:
    requires.installed("sglang")
    started: list[group.Launcher] = []

    def start(world: int, patches: tuple[str, ...]) -> list[dict[str, Any]]:
        sc = Scenario(port=group.free_port(), ledger=str(tmp_path / "ledger"), workdir=str(tmp_path),
                      patches=patches, world=world, iterations=1, arrivals={}, local_aborts={})
        started.append(group.start(sc, module="tests.repro.admission"))
        log = tmp_path / "launcher.log"
        assert started[-1].wait(timeout=150) == 0, log.read_text(errors="replace")[-4000:]
        return [json.loads(sc.result_path(rank).read_text()) for rank in range(world)]

    try:
        yield start
    finally:
        for proc in started:
            group.kill(proc)


@pytest.mark.parametrize("world", [2, 3])
def test_unpatched_the_rank_with_less_memory_resumes_fewer_requests_than_its_peers(run: Any, world: int) -> None:
    results = run(world, ())
    tight = results[-1]
    assert tight["resumed"] == ["req-0", "req-1"] and tight["still_retracted"] == ["req-2"]
    for peer in results[:-1]:
        assert peer["resumed"] == ["req-0", "req-1", "req-2"] and peer["still_retracted"] == []
        assert peer["collectives_entered"] == []


@pytest.mark.parametrize("world", [2, 3])
def test_patched_every_rank_resumes_the_same_requests_and_keeps_its_surplus(run: Any, world: int) -> None:
    results = run(world, (ac.PATCH_ID,))
    for result in results:
        assert result["applied"] == [ac.PATCH_ID]
        assert result["resumed"] == ["req-0", "req-1"] and result["still_retracted"] == ["req-2"]
        assert result["collectives_entered"] == [phases.Phase.ADMISSION_AGREEMENT.label]
    spent = admission.TIGHT_FREE - results[-1]["free_tokens"]
    # Each rank spent the same; the roomier ones keep what they had beyond the smallest (their readers are
    # SGLang's own again after the call).
    assert [r["free_tokens"] for r in results[:-1]] == [admission.FREE - spent] * (world - 1)


@pytest.mark.parametrize(("world", "patches", "dropped"), [
    (2, ("kv-poll-lockstep",), True), (3, ("kv-poll-lockstep",), True),
    (2, ("kv-poll-lockstep", ac.PATCH_ID), False), (3, ("kv-poll-lockstep", ac.PATCH_ID), False),
], ids=["lockstep-2", "lockstep-3", "agreed-2", "agreed-3"])
def test_a_prefill_rank_short_of_metadata_buffers_moves_requests_on_with_its_peers_only_when_agreed(
        tmp_path: Path, world: int, patches: tuple[str, ...], dropped: bool) -> None:
    requires.installed("sglang")
    sc = Scenario(port=group.free_port(), ledger=str(tmp_path / "ledger"), workdir=str(tmp_path), patches=patches,
                  world=world, iterations=6, arrivals={}, local_aborts={}, role="prefill",
                  handshakes={0: [("held-a", 10_000), ("held-b", 10_000)]}, metadata_slots={world - 1: 1},
                  forward_s=0.01, idle_s=0.01)
    proc = group.start(sc)
    try:
        assert proc.wait(timeout=150) == 0, (tmp_path / "launcher.log").read_text(errors="replace")[-4000:]
    finally:
        group.kill(proc)
    for rank in range(world):
        result = json.loads(sc.result_path(rank).read_text())
        assert result["applied"] == list(patches)
        assert set(result["dropped"]) == ({"held-b"} if dropped else set()), f"rank {rank}: {result['dropped']}"
        assert (phases.Phase.ADMISSION_AGREEMENT.label in result["collectives_entered"]) is not dropped


class _Pool:
    def __init__(self, free: int) -> None:
        self.free = free

    def available_size(self) -> int:
        return self.free


class _SwaPool(_Pool):
    def full_available_size(self) -> int:
        return self.free

    def swa_available_size(self) -> int:
        return self.free // 2


def _vector(**by_reader: int) -> list[int]:
    """A capacity vector in `READERS` order, from `owner_path__reader=value` (0 elsewhere)."""
    return [by_reader.get(f"{path.replace('.', '__')}__{name}", 0) for path, name in ac.READERS]


class _Tree:
    def __init__(self, evictable: int) -> None:
        self.evictable = evictable

    def evictable_size(self) -> int:
        return self.evictable


def test_the_readers_answer_the_groups_smallest_capacity_inside_and_their_own_after() -> None:
    kv, slots, meta, tree = _SwaPool(1000), _Pool(10), _Pool(8), _Tree(70)
    queue = SimpleNamespace(token_to_kv_pool_allocator=kv, req_to_token_pool=slots,
                            req_to_metadata_buffer_idx_allocator=meta, tree_cache=tree)
    sent: list[list[int]] = []
    peer = _vector(token_to_kv_pool_allocator__available_size=600, token_to_kv_pool_allocator__full_available_size=600,
                   token_to_kv_pool_allocator__swa_available_size=300, req_to_token_pool__available_size=12,
                   req_to_metadata_buffer_idx_allocator__available_size=8, tree_cache__evictable_size=50)

    def reduce_min(values: list[int], group: Any) -> list[int]:  # a peer with 600 tokens, 12 slots, 50 evictable
        sent.append(list(values))
        return [min(v, p) for v, p in zip(values, peer, strict=True)]

    with ac.agreed_capacity(queue, "group", reduce_min) as surplus:
        assert surplus == _vector(token_to_kv_pool_allocator__available_size=400,
                                  token_to_kv_pool_allocator__full_available_size=400,
                                  token_to_kv_pool_allocator__swa_available_size=200, tree_cache__evictable_size=20)
        assert (kv.available_size(), kv.full_available_size(), kv.swa_available_size()) == (600, 600, 300)
        kv.free -= 100  # an allocation inside the call: the clamp follows the real pool
        tree.evictable -= 10  # a prefix locked inside the call: the same on every rank
        assert (kv.available_size(), tree.evictable_size()) == (500, 40)
        assert (slots.available_size(), meta.available_size()) == (10, 8)
    assert sent == [_vector(token_to_kv_pool_allocator__available_size=1000,
                            token_to_kv_pool_allocator__full_available_size=1000,
                            token_to_kv_pool_allocator__swa_available_size=500, req_to_token_pool__available_size=10,
                            req_to_metadata_buffer_idx_allocator__available_size=8, tree_cache__evictable_size=70)]
    assert (kv.available_size(), kv.swa_available_size(), tree.evictable_size()) == (900, 450, 60)
    assert "available_size" not in vars(kv) and "evictable_size" not in vars(tree)


def test_nested_pools_are_agreed_and_one_pool_reached_twice_counts_once() -> None:
    mamba = SimpleNamespace(schedulable_available_size=lambda: 9)
    hisparse = _Pool(30)
    kv = SimpleNamespace(available_size=lambda: 100, mamba_allocator=mamba, hisparse_attn_allocator=hisparse)
    root = SimpleNamespace(token_to_kv_pool_allocator=kv, req_to_token_pool=SimpleNamespace(mamba_allocator=mamba))
    sent: list[list[int]] = []
    with ac.agreed_capacity(root, "group", lambda values, group: sent.append(list(values)) or [0] * len(values)):
        assert (mamba.schedulable_available_size(), hisparse.available_size()) == (0, 0)
    assert sent == [_vector(token_to_kv_pool_allocator__available_size=100,
                            token_to_kv_pool_allocator__hisparse_attn_allocator__available_size=30,
                            req_to_token_pool__mamba_allocator__schedulable_available_size=9)]
    assert mamba.schedulable_available_size() == 9


def test_a_pool_without_a_reader_counts_zero_and_an_instance_reader_is_put_back() -> None:
    own = SimpleNamespace(available_size=lambda: 50)  # a reader that is an instance attribute
    queue = SimpleNamespace(token_to_kv_pool_allocator=_Pool(70), req_to_token_pool=own,
                            req_to_metadata_buffer_idx_allocator=None)
    before = own.available_size
    with ac.agreed_capacity(queue, "group", lambda values, group: [min(v, 40) for v in values]) as surplus:
        assert surplus == _vector(token_to_kv_pool_allocator__available_size=30, req_to_token_pool__available_size=10)
        assert own.available_size() == 40
    assert own.available_size is before


def test_the_agreement_is_one_collective_in_the_ledger() -> None:
    entered: list[phases.Phase] = []

    class Writer(seams.UNATTACHED.__class__):  # type: ignore[misc]
        def collective(self, phase: phases.Phase) -> None:
            entered.append(phase)

    seams.use(Writer())
    try:
        with ac.agreed_capacity(SimpleNamespace(), "group", lambda values, group: values):
            pass
    finally:
        seams.use(seams.UNATTACHED)
    assert entered == [phases.Phase.ADMISSION_AGREEMENT]


@pytest.fixture
def restore_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    patched_sglang.restore_after_test(monkeypatch, FIXES)


def test_the_patch_installs_with_every_other_desync_fix_and_passes_pp_through(restore_sglang: None) -> None:
    from sglang.srt.disaggregation.decode import DecodePreallocQueue

    applied = base.apply(FIXES, SGLANG_VERSION, registry.implementations(FIXES))
    assert [a.id for a in applied] == list(FIXES)
    for dotted in (ac.POP_PREALLOCATED, ac.RESUME_RETRACTED, ac.PREFILL_ADMISSION):
        assert targets.resolve(dotted).function.__pdfleet_patch__ == ac.PATCH_ID  # type: ignore[attr-defined]
    queue = object.__new__(DecodePreallocQueue)
    vars(queue).update(pp_size=2, retracted_queue=[])  # PP: no agreement (no process group exists here)
    calls: list[Any] = []
    vars(queue)["_allocatable_token_budgets"] = lambda **kw: calls.append(kw) or 0
    vars(queue)["_uses_swa_reservation"] = lambda: False
    assert queue.resume_retracted_reqs() == []
    assert calls  # SGLang's own body ran, unagreed


@pytest.mark.parametrize(("world", "patches", "agreed"), [
    (2, ("kv-poll-lockstep",), False), (3, ("kv-poll-lockstep",), False),
    (2, ("kv-poll-lockstep", ac.PATCH_ID), True), (3, ("kv-poll-lockstep", ac.PATCH_ID), True),
    (2, (ac.PATCH_ID,), True),
], ids=["lockstep-2", "lockstep-3", "agreed-2", "agreed-3", "agreement-alone-2"])
def test_a_prefill_rank_with_less_free_kv_builds_the_same_batches_as_its_peers_only_when_agreed(
        tmp_path: Path, world: int, patches: tuple[str, ...], agreed: bool) -> None:
    """SGLang's own prefill admission (tests/repro/prefill_admission.py). With `kv-poll-lockstep` alone no poll
    hangs, but the last rank prefills two requests while its peers prefill three (different batches: different
    forwards, whose TP collectives no longer pair on a GPU), and the third, waiting on the last rank and in
    flight on its peers, is then failed everywhere: lost to one rank's scarcity. Agreed, every rank prefills the
    same two, keeps the third waiting, and nothing is dropped."""
    requires.installed("sglang")
    rids = list(PREFILL_REQUESTS)
    sc = _prefill_short_of_kv(tmp_path, world, patches)
    proc = group.start(sc)
    try:
        assert proc.wait(timeout=150) == 0, (tmp_path / "launcher.log").read_text(errors="replace")[-4000:]
    finally:
        group.kill(proc)
    results = [json.loads(sc.result_path(rank).read_text()) for rank in range(world)]
    first = {rank: result["batches"][min(result["batches"])] for rank, result in enumerate(results)}
    if agreed:
        assert all(batch == rids[:2] for batch in first.values()), first
        assert all(result["dropped"] == {} for result in results)
        assert all(phases.Phase.ADMISSION_AGREEMENT.label in r["collectives_entered"] for r in results)
    else:
        assert first[world - 1] == rids[:2] and all(first[rank] == rids for rank in range(world - 1)), first
        assert all(phases.Phase.ADMISSION_AGREEMENT.label not in r["collectives_entered"] for r in results)
    for result in results:
        assert result["applied"] == list(patches)
        assert set(result["dropped"]) == ({"req-c"} if not agreed else set()), result["dropped"]



PREFILL_REQUESTS = ("req-a", "req-b", "req-c")


def _prefill_short_of_kv(tmp_path: Path, world: int, patches: tuple[str, ...]) -> Scenario:
    """Three requests arrive together; the last rank's KV pool has room for two, its peers' for all three."""
    return Scenario(port=group.free_port(), ledger=str(tmp_path / "ledger"), workdir=str(tmp_path), patches=patches,
                    world=world, iterations=4, arrivals={0: [(rid, 10_000) for rid in PREFILL_REQUESTS]},
                    local_aborts={}, role="prefill", kv_free={world - 1: 1000}, forward_s=0.01, idle_s=0.01)


@pytest.mark.parametrize("world", [2, 3])
def test_unpatched_a_prefill_rank_with_less_free_kv_desyncs_the_group(tmp_path: Path, world: int) -> None:
    """SGLang's own admission prefills two requests on the last rank and three on its peers. Their inflight
    queues then differ in length (gloo pairs polls of different sizes without noticing), and the last rank
    alone still has a waiting request, so it alone enters the waiting queue's bootstrap poll: from there it is
    one collective ahead, and pdfleet reports Desync with the last rank in the next broadcast and its peers in
    the transfer poll."""
    from pdfleet.runtime.health import verdict
    from tests.unit.test_desync_reproduction import PERIOD_S, POLICY

    requires.installed("sglang")
    sc = _prefill_short_of_kv(tmp_path, world, ())
    proc = group.start(sc)
    try:
        samples = group.watch(sc.ledger, sc.world, POLICY, period_s=PERIOD_S, deadline_s=60.0,
                              until=lambda v: v.health not in (verdict.Health.HEALTHY, verdict.Health.STARTING))
        last = samples[-1].verdict
        assert last.health is verdict.Health.DESYNC, last.reason
        assert proc.poll() is None, "the ranks must still be hanging, not have failed"
    finally:
        group.kill(proc)
    ranks = {v.rank: v for v in last.ranks}
    tight, peers = ranks[world - 1], [ranks[r] for r in range(world - 1)]
    assert tight.phase is phases.Phase.RECV_BROADCAST
    assert {p.phase for p in peers} == {phases.Phase.PREFILL_INFLIGHT_POLL}
    assert {p.collectives for p in peers} == {tight.collectives - 1}, "the last rank entered one poll alone"
    assert f"rank {world - 1} in recv_broadcast" in last.reason and "prefill_inflight_poll" in last.reason


def test_the_host_receive_thresholds_pool_usage_is_read_through_the_agreed_readers() -> None:
    """SGLang's pool-usage observer, which `pop_preallocated` asks whether to preallocate on the host
    (`--disaggregation-decode-host-receive-threshold`), reads the same allocator and radix cache as the queue: inside
    the agreement its usage is the group's (here a peer with 300 free tokens of 1000), not this rank's."""
    requires.installed("sglang")
    from sglang.srt.managers.scheduler_components.pool_stats_observer import SchedulerPoolStatsObserver

    kv, tree = _Pool(800), _Tree(0)
    observer = SchedulerPoolStatsObserver(
        tree_cache=tree, token_to_kv_pool_allocator=kv, req_to_token_pool=None, session_controller=None,
        hisparse_coordinator=None, is_hybrid_swa=False, is_hybrid_ssm=False, enable_hisparse=False,
        full_tokens_per_layer=None, swa_tokens_per_layer=None, max_total_num_tokens=1000)
    queue = SimpleNamespace(token_to_kv_pool_allocator=kv, tree_cache=tree)
    peer = _vector(token_to_kv_pool_allocator__available_size=300)
    assert observer.get_pool_stats().full_token_usage == pytest.approx(0.2)
    with ac.agreed_capacity(queue, "group", lambda values, _: [min(v, p) for v, p in zip(values, peer, strict=True)]):
        assert observer.get_pool_stats().full_token_usage == pytest.approx(0.7)
    assert observer.get_pool_stats().full_token_usage == pytest.approx(0.2)


def test_agreement_over_attention_tp_then_cp_is_the_min_over_both() -> None:
    """Each rank of the CP group already holds its TP group's MIN, so reducing group by group is the MIN over the
    whole DP group; a single no anywhere is every rank's no."""
    seen: list[str] = []

    def reduce_min(values: list[int], group: Any) -> list[int]:  # this rank's TP peer has less; its CP peer more
        seen.append(group)
        peer = {"tp": [5, 1], "cp": [9, 0]}[group]
        return [min(v, p) for v, p in zip(values, peer, strict=True)]

    assert ac.over_groups([7, 1], ("tp", "cp"), reduce_min) == [5, 0]
    assert seen == ["tp", "cp"]
    assert ac.every_rank_can(True, ("tp",), lambda v, g: v) is True
    assert ac.every_rank_can(True, ("tp", "cp"), lambda v, g: [0] if g == "cp" else v) is False


def test_the_unified_swa_pools_usage_denominator_follows_the_clamped_free_size() -> None:
    """SGLang's unified SWA pool reports its usage against `current_full_capacity`, its own free size plus what it
    has allocated: inside the agreement the free size is the group's, so only the allocations (equal on every
    rank that made the same agreed decisions) are the rank's own."""
    requires.installed("sglang")
    from sglang.srt.mem_cache.allocator.unified_hybrid_swa import UnifiedSWATokenToKVPoolAllocator

    side = SimpleNamespace(allocated_count=lambda: 100, schedulable_available_size=lambda: 10_000)
    pool = object.__new__(UnifiedSWATokenToKVPoolAllocator)
    vars(pool).update(full_attn_allocator=side, swa_attn_allocator=side, _full_max_total_num_tokens=1000,
                      _swa_max_total_num_tokens=1000,
                      available_size=lambda: 900)  # the joint view, memoized over the sub-pools' chain: not here
    assert (pool.full_available_size(), pool.current_full_capacity) == (900, 1000)
    peer = _vector(token_to_kv_pool_allocator__full_available_size=600)
    with ac.agreed_capacity(SimpleNamespace(token_to_kv_pool_allocator=pool), "group",
                            lambda values, _: [min(v, p) for v, p in zip(values, peer, strict=True)]):
        assert (pool.full_available_size(), pool.current_full_capacity) == (600, 700)
        (full_capacity, full_free), _ = pool.swa_capacity_and_available(full_capacity=0, swa_capacity=0)
        assert (full_capacity, full_free) == (700, 600)
    assert pool.current_full_capacity == 1000
