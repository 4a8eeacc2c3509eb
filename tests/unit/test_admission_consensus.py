"""admission-consensus: a rank with less free memory no longer resumes, admits or moves on requests alone.

Reproduced on a real gloo group (tests/repro/admission.py) with SGLang 0.5.23's own
`DecodePreallocQueue.resume_retracted_reqs`, token budget and allocator checks: every rank holds the same three
retracted requests; the last rank has room for two. Unpatched, it resumes two while its peers resume three: the
ranks decode different batches from then on, and that rank alone still holds a retracted request (the retraction
gate's input: without `kv-poll-lockstep` the decode polls hang on it, as test_desync_reproduction shows). Patched,
every rank agrees the smallest free capacity first and resumes the same two, keeping its own surplus.

Prefill (tests/repro/prefill.py, SGLang's own `pop_bootstrapped`, `ensure_metadata_buffer` and metadata
allocator): two requests that may be prefilled before their bootstrap completes arrive together; the last rank has
one free metadata buffer, its peers plenty. With `kv-poll-lockstep` alone, the last rank moves one on and keeps the
other, its peers move both: the lockstep then fails the second on every rank (no rank can complete it), a request
lost to one rank's scarcity. With `admission-consensus` too, every rank agrees no buffer is free for the second,
keeps it, and nothing is dropped.
"""

from __future__ import annotations

import json
import subprocess
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
    started: list[subprocess.Popen[bytes]] = []

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


def test_the_readers_answer_the_groups_smallest_capacity_inside_and_their_own_after() -> None:
    kv, slots, meta = _SwaPool(1000), _Pool(10), _Pool(8)
    queue = SimpleNamespace(token_to_kv_pool_allocator=kv, req_to_token_pool=slots,
                            req_to_metadata_buffer_idx_allocator=meta)
    sent: list[list[int]] = []

    def reduce_min(values: list[int], group: Any) -> list[int]:  # a peer with 600 tokens and 12 slots
        sent.append(list(values))
        return [min(v, p) for v, p in zip(values, [600, 600, 300, 12, 8], strict=True)]

    with ac.agreed_capacity(queue, "group", reduce_min) as surplus:
        assert surplus == [400, 400, 200, 0, 0]
        assert (kv.available_size(), kv.full_available_size(), kv.swa_available_size()) == (600, 600, 300)
        kv.free -= 100  # an allocation inside the call: the clamp follows the real pool
        assert kv.available_size() == 500
        assert (slots.available_size(), meta.available_size()) == (10, 8)
    assert sent == [[1000, 1000, 500, 10, 8]]
    assert (kv.available_size(), kv.swa_available_size()) == (900, 450)
    assert "available_size" not in vars(kv)


def test_a_pool_without_a_reader_counts_zero_and_an_instance_reader_is_put_back() -> None:
    own = SimpleNamespace(available_size=lambda: 50)  # a reader that is an instance attribute
    queue = SimpleNamespace(token_to_kv_pool_allocator=_Pool(70), req_to_token_pool=own,
                            req_to_metadata_buffer_idx_allocator=None)
    before = own.available_size
    with ac.agreed_capacity(queue, "group", lambda values, group: [min(v, 40) for v in values]) as surplus:
        assert surplus == [30, 0, 0, 10, 0]
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
    for dotted in (ac.POP_PREALLOCATED, ac.RESUME_RETRACTED):
        assert targets.resolve(dotted).function.__pdfleet_patch__ == ac.PATCH_ID  # type: ignore[attr-defined]
    queue = object.__new__(DecodePreallocQueue)
    vars(queue).update(pp_size=2, retracted_queue=[])  # PP: no agreement (no process group exists here)
    calls: list[Any] = []
    vars(queue)["_allocatable_token_budgets"] = lambda **kw: calls.append(kw) or 0
    vars(queue)["_uses_swa_reservation"] = lambda: False
    assert queue.resume_retracted_reqs() == []
    assert calls  # SGLang's own body ran, unagreed
