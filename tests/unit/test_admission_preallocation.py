"""admission-consensus agrees SGLang's real `DecodePreallocQueue.pop_preallocated` across a decode group.

Reproduced on a real gloo group (tests/repro/preallocation.py) with SGLang 0.5.23's own `pop_preallocated`, its
token budget, request-slot and metadata checks, `_pre_alloc` into a real `TokenToKVPoolAllocator` and
`ReqToTokenPool` on the CPU, and `DecodeTransferQueue.extend`: every rank's prealloc queue holds the same three
requests whose handshakes completed; the last rank's pool has room for two. Unpatched it moves two to its transfer
queue while its peers move three (the transfer queues, and so the KV polls over them, differ). Patched, every
rank agrees the smallest free capacity first and moves the same two, keeping its own surplus.

In the decode loop (tests/repro/preallocation.py `--loop`, tests.repro.decode_loop with the same pools): unpatched,
at 2 and 3 ranks, the transfer polls no longer pair and pdfleet reports Desync, the last rank in the next request
broadcast and its peers in SGLang's transfer poll; with `kv-poll-lockstep` and `admission-consensus` every rank
moves req-0 and req-1 at iteration 0 and req-2 at iteration 1, decodes them alike and completes Healthy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdfleet.runtime.health import phases, verdict
from pdfleet.runtime.patches.impl import admission_consensus as ac
from tests.repro import group, preallocation
from tests.repro.scenario import Scenario
from tests.support import requires
from tests.unit.test_desync_reproduction import (
    DECODE_LOCKSTEP,
    DESYNC_AFTER_S,
    JITTER_S,
    PERIOD_S,
    POLICY,
    STARTUP_S,
    _assert_every_rank_completes_healthy,
    _in_loop,
    _log,
)

ALL = ["req-0", "req-1", "req-2"]
TWO = ["req-0", "req-1"]
HANDSHAKE_POLL = phases.Phase.PREALLOC_HANDSHAKE_POLL.label
AGREEMENT = phases.Phase.ADMISSION_AGREEMENT.label


def _run(tmp_path: Path, world: int, patches: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each rank's result of one `pop_preallocated` on a fresh group of `world` ranks."""
    requires.installed("sglang")
    sc = Scenario(port=group.free_port(), ledger=str(tmp_path / "ledger"), workdir=str(tmp_path), patches=patches,
                  world=world, iterations=1, arrivals={}, local_aborts={})
    launcher = group.start(sc, module="tests.repro.preallocation")
    try:
        exit_status = launcher.wait(timeout=150)
    finally:
        group.kill(launcher)  # a rank stuck in the group must not outlive the test
    assert exit_status == 0, (tmp_path / "launcher.log").read_text(errors="replace")[-4000:]
    return [json.loads(sc.result_path(rank).read_text()) for rank in range(world)]


def _pages_as_sglang_wrote_them(result: dict[str, Any]) -> None:
    """What each moved request was sent is what SGLang's `_pre_alloc` took from the pool and wrote into its
    `req_to_token` row: the real preallocation ran, not a count."""
    for rid in result["moved"]:
        pages = result["sent_pages"][rid]
        assert len(pages) == preallocation.PROMPT and pages == result["req_to_token_rows"][rid]
    taken = [page for rid in result["moved"] for page in result["sent_pages"][rid]]
    assert len(set(taken)) == len(taken)


@pytest.mark.parametrize("world", [2, 3])
def test_unpatched_the_rank_with_less_memory_moves_fewer_requests_to_its_transfer_queue(
        tmp_path: Path, world: int) -> None:
    results = _run(tmp_path, world, ())
    tight = results[-1]
    assert tight["moved"] == TWO and tight["still_queued"] == ["req-2"] and tight["failed"] == []
    assert tight["free_tokens"] == preallocation.TIGHT_FREE - 2 * preallocation.PROMPT
    for peer in results[:-1]:
        assert peer["moved"] == ALL and peer["still_queued"] == [] and peer["failed"] == []
        assert peer["free_tokens"] == preallocation.FREE - 3 * preallocation.PROMPT
    for result in results:
        assert result["patched"] == {} and result["collectives_entered"] == [HANDSHAKE_POLL]
        _pages_as_sglang_wrote_them(result)


@pytest.mark.parametrize("world", [2, 3])
def test_patched_every_rank_moves_the_groups_smallest_admission_and_keeps_its_surplus(
        tmp_path: Path, world: int) -> None:
    results = _run(tmp_path, world, (ac.PATCH_ID,))
    for result in results:
        assert result["applied"] == [ac.PATCH_ID]
        assert result["patched"]["DecodePreallocQueue.pop_preallocated"] == ac.PATCH_ID
        assert result["moved"] == TWO and result["still_queued"] == ["req-2"] and result["failed"] == []
        # One agreement per call, before SGLang's own handshake poll inside it.
        assert result["collectives_entered"] == [AGREEMENT, HANDSHAKE_POLL]
        assert result["free_slots"] == preallocation.SLOTS - 2 and result["reader_is_sglangs"]
        _pages_as_sglang_wrote_them(result)
    spent = 2 * preallocation.PROMPT
    assert results[-1]["free_tokens"] == preallocation.TIGHT_FREE - spent
    # The roomier ranks spent the same and keep what they had beyond the smallest.
    assert [r["free_tokens"] for r in results[:-1]] == [preallocation.FREE - spent] * (world - 1)


# The decode loop (`--loop`): the same pools and requests, the requests arriving through the broadcast at iteration
# 0 with their handshakes completing on the first poll, and SGLang's own loop steps around pop_preallocated.
TIGHT_STORY = {"iterations": 60, "arrivals": {}, "local_aborts": {},
               "handshakes": {0: [(rid, 1) for rid in ALL]}}


def _start_loop(tmp_path: Path, world: int, patches: tuple[str, ...]) -> tuple[Scenario, group.Launcher]:
    requires.installed("sglang")
    sc = Scenario(port=group.free_port(), ledger=str(tmp_path / "ledger"), workdir=str(tmp_path), patches=patches,
                  world=world, **TIGHT_STORY)  # type: ignore[arg-type]
    return sc, group.start(sc, module="tests.repro.preallocation", args=("--loop",))


@pytest.mark.parametrize("world", [2, 3])
def test_unpatched_the_differing_transfer_queues_hang_the_decode_loop_and_pdfleet_reports_desync(
        tmp_path: Path, world: int) -> None:
    """The last rank moved two requests on, its peers three, so SGLang's KV poll of the transfer queue
    all-reduces two poll states there and three on the peers: gloo completes the last rank's two-element
    reduce, which goes on to the next request broadcast, while its peers wait in the poll for a third."""
    sc, proc = _start_loop(tmp_path, world, ())
    try:
        assert group.wait_for(_in_loop(sc), timeout_s=STARTUP_S), _log(sc)
        samples = group.watch(sc.ledger, world, POLICY, period_s=PERIOD_S, deadline_s=30.0,
                              until=lambda v: v.health not in (verdict.Health.HEALTHY, verdict.Health.STARTING))
        last = samples[-1]
        assert last.verdict.health is verdict.Health.DESYNC, f"{last.verdict}\n{_log(sc)}"
        assert proc.poll() is None, "the ranks must still be hanging, not have failed"
        ranks = {v.rank: v for v in last.verdict.ranks}
        tight, peers = world - 1, list(range(world - 1))
        n = ranks[0].collectives  # broadcast, handshake poll, transfer poll: the peers are in their third
        assert (n, ranks[0].phase) == (3, phases.Phase.DECODE_TRANSFER_POLL)
        assert {(ranks[r].phase, ranks[r].collectives) for r in peers} == {(phases.Phase.DECODE_TRANSFER_POLL, n)}
        assert (ranks[tight].phase, ranks[tight].collectives) == (phases.Phase.RECV_BROADCAST, n + 1)
        assert f"rank {tight} in recv_broadcast at collective {n + 1}" in last.verdict.reason
        named = ("rank " if len(peers) == 1 else "ranks ") + ",".join(str(r) for r in peers)
        assert f"{named} in decode_transfer_poll at collective {n}" in last.verdict.reason
        # Time to Desync, from the moment the last rank blocked to the first verdict that said so.
        blocked_ns = last.at_ns - last.verdict.held_ns
        latency_s = min(s.at_ns for s in samples if s.verdict.health is verdict.Health.DESYNC) / 1e9 - blocked_ns / 1e9
        assert DESYNC_AFTER_S < latency_s <= DESYNC_AFTER_S + PERIOD_S + JITTER_S
    finally:
        group.kill(proc)


@pytest.mark.parametrize("world", [2, 3])
def test_with_lockstep_and_admission_consensus_every_rank_moves_and_decodes_the_same_requests_healthy(
        tmp_path: Path, world: int) -> None:
    patches = ("kv-poll-lockstep", ac.PATCH_ID)
    sc, proc = _start_loop(tmp_path, world, patches)
    try:
        assert group.wait_for(_in_loop(sc), timeout_s=STARTUP_S), _log(sc)
        _assert_every_rank_completes_healthy(sc, proc)
    finally:
        group.kill(proc)
    for rank in range(world):
        result = json.loads(sc.result_path(rank).read_text())
        assert result["patched"]["DecodePreallocQueue.pop_preallocated"] == ac.PATCH_ID
        # Agreed on the last rank's room: two at iteration 0, the third once 122 free tokens are agreed at 1.
        assert result["transferred"] == {"req-0": 0, "req-1": 0, "req-2": 1}, f"rank {rank}"
        assert result["finished"] == {"req-0": 3, "req-1": 3, "req-2": 4} and result["dropped"] == {}
        assert result["collectives_entered"] == sorted([*DECODE_LOCKSTEP, AGREEMENT])
