"""retraction-consensus: one rank's fuller KV pool no longer makes it retract, drain or decode alone.

Reproduced on a real gloo group (tests/repro/retraction.py) with SGLang 0.5.23's own `update_running_batch`,
`check_decode_mem`, `retract_decode` and decode KV offload manager: from iteration 2 the last rank's allocator
has room for 2 of the batch's 4 next tokens, its peers' for plenty. With decode KV offload, unpatched, that rank
alone enters `drain_before_retraction`'s all-reduces while its peers go on to the next request broadcast: the
group hangs, and pdfleet judges Desync naming the drain. Without offload nothing hangs at once, but the ranks'
batches differ (2 requests on one rank, 4 on its peers: their forward's collectives no longer pair). With the
patch every rank agrees the step does not fit, drains together, retracts the same two requests and decodes the
same batch, Healthy.

With a host-pool retraction backup (`--host-pool`: SGLang's own `release_req`, `backup_kv_cache` and
`UnifiedRadixCache.backup_kv_cache` into a real `MHATokenToKVPoolHost` per rank) every rank's KV pool fills, so
the ranks retract the same two requests even unpatched, but the last rank's host pool has room for the first
one's backup only: unpatched it aborts the second request while its peers keep it retracted. Patched, every rank
aborts it, and the peers give back the backup they took: each host pool holds exactly the retracted request's.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pdfleet.runtime.health import phases, verdict
from pdfleet.runtime.patches import base, registry, targets
from pdfleet.runtime.patches.impl import retraction_consensus
from tests.repro import group, host_backup, retraction
from tests.repro.scenario import SGLANG_VERSION, Scenario
from tests.support import patched_sglang, requires

PATCH = retraction_consensus.PATCH_ID
FIXES = ("kv-poll-lockstep", "abort-consensus", "health-check-consensus", PATCH)
POLICY = verdict.HealthPolicy.from_seconds(desync_after=2.0, hang_after=60.0)
STARTUP_S = 120.0  # importing SGLang once, then forking the ranks, on a small CI machine
ITERATIONS = 8
TIGHT_FROM = 2
Phase = phases.Phase
Run = Callable[..., tuple[Scenario, group.Launcher]]


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    requires.installed("sglang")
    started: list[group.Launcher] = []

    def start(world: int, patches: tuple[str, ...], offload: bool,
              host_pool: bool = False) -> tuple[Scenario, group.Launcher]:
        workdir = tmp_path / f"w{len(started)}"
        workdir.mkdir()
        sc = Scenario(port=group.free_port(), ledger=str(workdir / "ledger"), workdir=str(workdir),
                      patches=patches, world=world, iterations=ITERATIONS, arrivals={}, local_aborts={},
                      forward_s=0.05, idle_s=0.05)
        args = ("--tight-from", str(TIGHT_FROM), *(("--offload",) if offload else ()),
                *(("--host-pool",) if host_pool else ()))
        started.append(group.start(sc, module="tests.repro.retraction", args=args))
        return sc, started[-1]

    try:
        yield start
    finally:
        for proc in started:
            group.kill(proc)


def _log(sc: Scenario) -> str:
    return (Path(sc.workdir) / "launcher.log").read_text(errors="replace")[-4000:]


def _started(sc: Scenario, proc: group.Launcher) -> None:
    def in_loop() -> bool:
        return all(v.status is verdict.RankStatus.REPORTING and v.iteration >= 1
                   for v in group.views(sc.ledger, sc.world))

    if not group.wait_for(lambda: in_loop() or proc.poll() is not None, timeout_s=STARTUP_S):
        pytest.fail(f"the ranks did not enter their loop in {STARTUP_S} s:\n{_log(sc)}")


def _results(sc: Scenario, proc: group.Launcher) -> list[dict[str, Any]]:
    assert proc.wait(timeout=90) == 0, _log(sc)
    return [json.loads(sc.result_path(rank).read_text()) for rank in range(sc.world)]


@pytest.mark.parametrize("world", [2, 3])
def test_unpatched_a_rank_that_must_retract_drains_alone_and_the_group_desyncs_in_the_drain(
        run: Run, world: int) -> None:
    sc, proc = run(world, (), offload=True)
    _started(sc, proc)
    samples = group.watch(sc.ledger, sc.world, POLICY, period_s=0.5, deadline_s=30.0,
                          until=lambda v: v.health not in (verdict.Health.HEALTHY, verdict.Health.STARTING))
    last = samples[-1].verdict
    assert last.health is verdict.Health.DESYNC, f"{last}\n{_log(sc)}"
    assert proc.poll() is None, "the ranks must still be hanging, not have failed"
    ranks = {v.rank: v for v in last.ranks}
    tight, peers = world - 1, list(range(world - 1))
    assert ranks[tight].phase is Phase.OFFLOAD_RETRACTION_DRAIN
    assert {ranks[r].phase for r in peers} == {Phase.RECV_BROADCAST}
    assert ranks[tight].iteration == TIGHT_FROM + 1  # iterations count from 1: it never left that one
    assert f"rank {tight} in offload_retraction_drain" in last.reason


@pytest.mark.parametrize("world", [2, 3])
def test_patched_every_rank_drains_retracts_and_decodes_the_same_batch_healthy(run: Run, world: int) -> None:
    sc, proc = run(world, (PATCH,), offload=True)
    _started(sc, proc)
    samples = group.watch(sc.ledger, sc.world, POLICY, period_s=0.5, deadline_s=60.0,
                          until=lambda v: proc.poll() is not None)
    results = _results(sc, proc)
    judged = [s.verdict.health for s in samples if all(r.phase is not Phase.EXITED for r in s.verdict.ranks)]
    assert judged and set(judged) <= {verdict.Health.HEALTHY, verdict.Health.STARTING}, judged
    assert verdict.Health.HEALTHY in judged
    batches = {json.dumps(r["batches"]) for r in results}
    assert len(batches) == 1, "every rank must decode the same batch every iteration"
    [shared] = [r["batches"] for r in results[:1]]
    assert [len(b) for b in shared] == [4] * TIGHT_FROM + [2] * (ITERATIONS - TIGHT_FROM)
    assert {tuple(r["retracted"]) for r in results} == {tuple(results[0]["retracted"])}
    assert len(results[0]["retracted"]) == 2
    for result in results:
        assert result["applied"] == [PATCH]
        assert result["collectives_entered"] == sorted(
            p.label for p in (Phase.RECV_BROADCAST, Phase.DECODE_MEMORY_AGREEMENT, Phase.OFFLOAD_RETRACTION_DRAIN))


@pytest.mark.parametrize(("patches", "agree"), [((), False), ((PATCH,), True)], ids=["unpatched", "patched"])
def test_without_offload_only_the_patch_keeps_the_ranks_batches_equal(
        run: Run, patches: tuple[str, ...], agree: bool) -> None:
    sc, proc = run(2, patches, offload=False)
    results = _results(sc, proc)
    sizes = [[len(b) for b in r["batches"]] for r in results]
    assert sizes[1] == [4] * TIGHT_FROM + [2] * (ITERATIONS - TIGHT_FROM)  # the tight rank retracts either way
    assert sizes[0] == (sizes[1] if agree else [4] * ITERATIONS), sizes


FIRST_BACKUP = 27  # host slots req-0's backup takes when it is retracted (seqlen 28 at iteration 2)


def _same_batches(results: list[dict[str, Any]]) -> None:
    assert len({json.dumps(r["batches"]) for r in results}) == 1, "the KV checks agree: every pool is tight"
    assert [len(b) for b in results[0]["batches"]] == [4] * TIGHT_FROM + [2] * (ITERATIONS - TIGHT_FROM)


@pytest.mark.parametrize("world", [2, 3])
def test_unpatched_with_a_host_pool_backup_the_tight_rank_aborts_a_request_its_peers_retract(
        run: Run, world: int) -> None:
    sc, proc = run(world, (), offload=False, host_pool=True)
    results = _results(sc, proc)
    _same_batches(results)
    *peers, tight = results
    assert tight["host_slots"] == retraction.TIGHT_HOST_SLOTS
    assert (tight["retracted"], tight["aborted"]) == (["req-0"], ["req-1"])
    for peer in peers:
        assert (peer["retracted"], peer["aborted"]) == (["req-0", "req-1"], [])
        assert peer["host_held"] > FIRST_BACKUP  # it keeps req-1's backup, for a request its tight peer aborted


@pytest.mark.parametrize("world", [2, 3])
def test_patched_every_rank_aborts_what_one_rank_could_not_back_up_and_leaks_no_host_slot(
        run: Run, world: int) -> None:
    sc, proc = run(world, (PATCH,), offload=False, host_pool=True)
    results = _results(sc, proc)
    _same_batches(results)
    for result in results:
        assert (result["retracted"], result["aborted"]) == (["req-0"], ["req-1"])
        assert result["host_held"] == FIRST_BACKUP
        # free after every retracting iteration = the pool less req-0's backup: req-1's was given back
        assert result["host_free"][TIGHT_FROM:] == [result["host_slots"] - FIRST_BACKUP] * (ITERATIONS - TIGHT_FROM)
        assert result["collectives_entered"] == sorted(
            p.label for p in (Phase.RECV_BROADCAST, Phase.DECODE_MEMORY_AGREEMENT))
    assert [r["host_slots"] for r in results] == [retraction.HOST_SLOTS] * (world - 1) + [retraction.TIGHT_HOST_SLOTS]


@pytest.fixture
def restore_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    patched_sglang.restore_after_test(monkeypatch, FIXES)


def test_the_patch_installs_with_the_other_desync_fixes_and_agrees_only_inside_update_running_batch(
        restore_sglang: None) -> None:
    """Against the installed SGLang: every target matches its fingerprint; outside update_running_batch the
    patched check_decode_mem is SGLang's own answer, with no collective (no process group exists here)."""
    applied = base.apply(FIXES, SGLANG_VERSION, registry.implementations(FIXES))
    assert [a.id for a in applied] == list(FIXES)
    check = targets.resolve(retraction_consensus.CHECK_DECODE_MEM).function
    assert check.__pdfleet_patch__ == PATCH  # type: ignore[attr-defined]
    batch = retraction._batch(retraction.Allocator())
    batch.token_to_kv_pool_allocator.free = 3
    assert batch.check_decode_mem() is False  # 4 requests need 4 new tokens at page size 1
    batch.token_to_kv_pool_allocator.free = 4
    assert batch.check_decode_mem() is True


def test_outside_update_running_batch_release_req_is_sglangs_own(restore_sglang: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The patched release_req agrees nothing outside update_running_batch (no process group exists here): a
    backup the host pool takes is kept, one it cannot take fails, as SGLang decides."""
    from sglang.srt.managers import schedule_batch

    base.apply(FIXES, SGLANG_VERSION, registry.implementations(FIXES))
    release = targets.resolve(retraction_consensus.BATCH_RELEASE_REQ).function
    assert release.__pdfleet_patch__ == PATCH  # type: ignore[attr-defined]
    monkeypatch.setattr(schedule_batch, "release_kv_cache", host_backup.release_kv_cache)
    monkeypatch.setattr(schedule_batch, "get_disagg", lambda: SimpleNamespace(
        disaggregation_mode="decode", disaggregation_decode_retraction_backup=retraction_consensus.HOST_POOL))
    device, host, cache = host_backup.build(retraction.REQUESTS, retraction.TIGHT_HOST_SLOTS)
    batch = retraction._batch(retraction.Allocator(device), cache)
    assert batch.release_req(0, 3) is True  # req-0 (seqlen 26): 25 slots
    assert batch.release_req(1, 2) is False  # req-1 (seqlen 27) needs 26 of the 15 left
    assert host.available_size() == retraction.TIGHT_HOST_SLOTS - 25
    assert batch.reqs[0].kv.retraction_backup is not None and batch.reqs[1].kv.retraction_backup is None


def test_a_changed_target_is_refused_and_nothing_is_installed(restore_sglang: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    def retract_decode(self: Any) -> Any:  # a release whose retraction loop is not the one the patch checked
        return [], 0.0, []

    monkeypatch.setattr(ScheduleBatch, "retract_decode", retract_decode)
    before = inspect.getattr_static(ScheduleBatch, "check_decode_mem")
    with pytest.raises(base.PatchError, match="retract_decode"):
        base.apply((PATCH,), SGLANG_VERSION, registry.implementations((PATCH,)))
    assert inspect.getattr_static(ScheduleBatch, "check_decode_mem") is before
