"""The overlap-abort desync, reproduced for real, detected by pdfleet, and prevented by each fix patch.

Rank processes on a real gloo group (127.0.0.1; four, and also two and three) run SGLang 0.5.23's own intake
(`ingest_requests` -> `broadcast_pyobj`), abort handling (`abort_request`) and KV poll (`process_decode_queue`
-> `pop_transferred` -> `poll_and_all_reduce`); see tests/repro. One rank's clock (rank 2; rank 1 in a group of
two) says a transfer timed out at iteration 3, rank 0's at iteration 5; each acts on its own signal. Unpatched,
that rank releases the transfer and its queue is empty: SGLang's `if not self.queue` guard skips the poll
all-reduce there, so its peers wait in the all-reduce while it waits in the next broadcast, forever (the gloo
timeout is 120 s). With a fix patch applied to SGLang's functions in the rank processes, every rank runs all
iterations and drops the request together.

The ranks run pdfleet's real rank instrumentation, so a Desync verdict names the collective each rank waits in
by the queue that entered it: unpatched, the peers of the rank that skipped a poll wait in that branch's own
poll (`decode_transfer_poll`, `prealloc_handshake_poll`, `prefill_bootstrap_poll`, `prefill_inflight_poll`);
patched, every rank goes only through pdfleet's exchanges in their place (each run reports the collectives
it entered).

The same harness injects the divergence at the decode loop's two other rank-local gates in front of a KV poll
(a retracted request on one rank; one rank's prealloc queue losing a request before the handshake poll), at
2 and 3 ranks: each hangs unpatched and completes with `kv-poll-lockstep`.
And in the prefill loop (tests/repro/prefill.py): one rank's bootstrap queue, its queue of transfers in
flight, its waiting queue or its chunked request loses a request on its own, so that rank skips the bootstrap
poll (`pop_bootstrapped`), the transfer poll (`process_disagg_prefill_inflight_queue`), the waiting queue's
bootstrap poll (`resolve_waiting_queue_bootstrap`) or the chunked request's (`process_prefill_chunk` ->
`check_bootstrap`) its peers enter; at 2 and 3 ranks each hangs unpatched and completes with `kv-poll-lockstep`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdfleet.runtime.health import phases, verdict
from tests.repro import group, prefill
from tests.repro.scenario import Scenario, early_rank

DESYNC_AFTER_S = 2.0
PERIOD_S = 0.5
# The poller's own cost on a loaded 2-core machine (a ledger read and a judgement take milliseconds).
JITTER_S = 0.2
POLICY = verdict.HealthPolicy.from_seconds(desync_after=DESYNC_AFTER_S, hang_after=60.0)
STARTUP_S = 120.0  # importing SGLang once, then forking the ranks, on a small CI machine
LOCKSTEP, CONSENSUS = "kv-poll-lockstep", "abort-consensus"


Phase = phases.Phase


def labels(*entered: Phase) -> list[str]:
    """The collectives a run reports it entered, as its result file lists them."""
    return sorted(phase.label for phase in entered)


# With kv-poll-lockstep a decode rank goes through the broadcast and pdfleet's three collectives only: SGLang's
# handshake and transfer polls are replaced by the exchanges, on every rank, every iteration.
DECODE_LOCKSTEP = labels(Phase.RECV_BROADCAST, Phase.RETRACTION_AGREEMENT, Phase.PREALLOC_HANDSHAKE_EXCHANGE,
                         Phase.DECODE_TRANSFER_EXCHANGE)
PREFILL_LOCKSTEP = labels(Phase.RECV_BROADCAST, Phase.PREFILL_BOOTSTRAP_EXCHANGE, Phase.PREFILL_INFLIGHT_EXCHANGE,
                          Phase.PREFILL_WAITING_BOOTSTRAP_EXCHANGE, Phase.PREFILL_CHUNK_BOOTSTRAP_EXCHANGE)


@dataclasses.dataclass(frozen=True)
class Expect:
    """What a run must show: a desync, the skipping rank's peers waiting in `waiting_in`; or every rank
    dropping `req-x` at `drop_iteration`, having entered exactly the collectives `entered`."""

    drop_iteration: int | None = None
    waiting_in: Phase | None = None
    entered: tuple[str, ...] = ()


# The peers of the rank that skipped the transfer poll wait in it: SGLang's own poll of the transfer queue.
HANGS = Expect(waiting_in=Phase.DECODE_TRANSFER_POLL)
# Rank 2 still acts alone at iteration 3; the lockstep exchange shows its peers it no longer holds the
# transfer, so they drop it in the same iteration.
LOCKSTEP_DROPS = Expect(drop_iteration=3, entered=tuple(DECODE_LOCKSTEP))
# Rank 2's local signal is ignored; rank 0's (iteration 5) rides the broadcast of iteration 6.
BOTH_DROP = Expect(drop_iteration=6, entered=tuple(DECODE_LOCKSTEP))
CASES = {
    "unpatched": ((), HANGS),
    "kv-poll-lockstep": ((LOCKSTEP,), LOCKSTEP_DROPS),
    # SGLang's own transfer poll, never skipped by one rank alone (the prealloc queue stays empty).
    "abort-consensus": ((CONSENSUS,), Expect(drop_iteration=6,
                                             entered=tuple(labels(Phase.RECV_BROADCAST, Phase.DECODE_TRANSFER_POLL)))),
    "both": ((LOCKSTEP, CONSENSUS), BOTH_DROP),
}
# The same story in smaller groups (a world size is not a constant of the reproduction): the hang, and a fix.
OTHER_WORLDS = {
    "world2-unpatched": (2, (), HANGS),
    "world2-kv-poll-lockstep": (2, (LOCKSTEP,), LOCKSTEP_DROPS),
    "world3-unpatched": (3, (), HANGS),
    "world3-both": (3, (LOCKSTEP, CONSENSUS), BOTH_DROP),
}
Launch = group.Launch


def _in_loop(sc: Scenario) -> Callable[[], bool]:
    # In the event loop as the verdict means it: a rank steps its iteration as it enters intake, before it marks
    # its first phase, so iteration 1 alone can still read Starting (a rank preempted there, on a loaded machine).
    def ready() -> bool:
        ranks = group.views(sc.ledger, sc.world)
        return all(v.status is verdict.RankStatus.REPORTING and v.iteration >= 1
                   and v.phase is not phases.Phase.STARTING for v in ranks)

    return ready


def _log(sc: Scenario) -> str:
    return (Path(sc.workdir) / "launcher.log").read_text(errors="replace")[-4000:]


@pytest.mark.parametrize(("patches", "expect"), list(CASES.values()), ids=list(CASES))
def test_a_rank_local_abort_desyncs_the_decode_loop_unless_a_fix_patch_keeps_ranks_together(
    launch: Launch, patches: tuple[str, ...], expect: Expect
) -> None:
    _run_and_judge(launch, 4, patches, expect)


@pytest.mark.parametrize(("world", "patches", "expect"), list(OTHER_WORLDS.values()), ids=list(OTHER_WORLDS))
def test_the_desync_and_its_fix_hold_in_groups_of_two_and_three_ranks(
    launch: Launch, world: int, patches: tuple[str, ...], expect: Expect
) -> None:
    _run_and_judge(launch, world, patches, expect)


def _run_and_judge(launch: Launch, world: int, patches: tuple[str, ...], expect: Expect) -> None:
    sc, proc = launch(patches, world)
    if not group.wait_for(lambda: _in_loop(sc)() or proc.poll() is not None, timeout_s=STARTUP_S):
        pytest.fail(f"the ranks did not enter their loop in {STARTUP_S} s:\n{_log(sc)}")
    if expect.waiting_in is not None:
        _assert_desync_is_detected_in_time(sc, proc, expect.waiting_in)
    else:
        _assert_every_rank_completes_and_drops_together(sc, proc, expect)


def _assert_desync_is_detected_in_time(sc: Scenario, proc: group.Launcher, waiting_in: Phase,
                                       early: int | None = None) -> None:
    """`early`: the rank that skipped the KV poll and waits in the next broadcast (the default story's);
    `waiting_in`: the skipped collective, where its peers wait, as the verdict must name it."""
    samples = group.watch(sc.ledger, sc.world, POLICY, period_s=PERIOD_S, deadline_s=30.0,
                          until=lambda v: v.health not in (verdict.Health.HEALTHY, verdict.Health.STARTING))
    last = samples[-1]
    assert last.verdict.health is verdict.Health.DESYNC, f"{last.verdict}\n{_log(sc)}"
    assert proc.poll() is None, "the ranks must still be hanging, not have failed"

    ranks = {v.rank: v for v in last.verdict.ranks}
    assert sorted(ranks) == list(range(sc.world))
    early = early_rank(sc.world) if early is None else early
    peers = [r for r in range(sc.world) if r != early]
    loop = prefill.LOOP if sc.role == "prefill" else phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE
    assert {v.loop for v in ranks.values()} == {loop}
    assert ranks[early].phase is phases.Phase.RECV_BROADCAST
    assert {ranks[r].phase for r in peers} == {waiting_in}
    n = ranks[0].collectives
    assert {v.collectives for v in ranks.values()} == {n}, "the early rank skipped the poll: its next is a broadcast"
    assert f"rank {early} in recv_broadcast at collective {n}" in last.verdict.reason
    waiting = f"rank {peers[0]}" if len(peers) == 1 else f"ranks {','.join(map(str, peers))}"
    assert f"{waiting} in {waiting_in.label} at collective {n}" in last.verdict.reason

    # Time to Desync: from the moment the last rank blocked (its phase start, on this host's monotonic clock)
    # to the first verdict that said so.
    onset_ns = last.at_ns - last.verdict.held_ns
    first = next(s for s in samples if s.verdict.health is verdict.Health.DESYNC)
    latency_s = (first.at_ns - onset_ns) / 1e9
    print(f"time to Desync: {latency_s:.2f} s (desyncAfter {DESYNC_AFTER_S} s, sampled every {PERIOD_S} s)")
    assert DESYNC_AFTER_S < latency_s <= DESYNC_AFTER_S + PERIOD_S + JITTER_S


def _assert_every_rank_completes_healthy(sc: Scenario, proc: group.Launcher) -> None:
    def finished(v: verdict.Verdict) -> bool:
        return any(r.iteration >= sc.iterations or r.phase is phases.Phase.EXITED for r in v.ranks)

    samples = group.watch(sc.ledger, sc.world, POLICY, period_s=PERIOD_S, deadline_s=60.0,
                          until=lambda v: finished(v) or proc.poll() is not None)
    assert proc.wait(timeout=60) == 0, _log(sc)
    judged = [s.verdict for s in samples if not finished(s.verdict)]
    assert len(judged) >= 3, "the run was too short to be watched"
    assert {v.health for v in judged} == {verdict.Health.HEALTHY}, [v.reason for v in judged]


def _assert_every_rank_completes_and_drops_together(
    sc: Scenario, proc: group.Launcher, expect: Expect
) -> None:
    _assert_every_rank_completes_healthy(sc, proc)
    results = [json.loads(sc.result_path(rank).read_text()) for rank in range(sc.world)]
    for result in results:
        assert result["iterations"] == sc.iterations
        assert sorted(result["applied"]) == sorted(sc.patches)
        assert set(result["patched"].values()) == set(sc.patches), "SGLang's own functions must be the patched ones"
        assert result["dropped"] == {"req-x": expect.drop_iteration}
        assert result["transferred"] == {"req-y": 1}
        assert result["finished"] == {"req-y": 1 + sc.decode_steps - 1}
        assert result["collectives_entered"] == list(expect.entered)


def test_a_story_naming_ranks_outside_the_group_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ranks \[2\] outside a group of 2"):
        Scenario(port=1, ledger=str(tmp_path / "ledger"), workdir=str(tmp_path), world=2)
    assert early_rank(2) == 1 and early_rank(3) == 2 and early_rank(8) == 2
    with pytest.raises(ValueError, match="at least 2 ranks"):
        early_rank(1)


# --- The decode loop's other rank-local gates in front of a KV poll (docs/desync-audit.md) ----------------
# Retraction: `process_decode_queue` returns early while the prealloc queue's retracted queue is non-empty, a
# condition each rank's own allocators decide. The last rank alone holds a retracted request in iterations
# 3-5, while `req-x` is in flight on every rank: unpatched, it skips the transfer poll its peers enter.
RETRACTION = {"local_aborts": {}, "retracted": {}}
# Handshake: `_update_handshake_waiters` returns at once on an empty prealloc queue. `req-p` waits in every
# rank's prealloc queue (its handshake never completes); the last rank alone releases it at iteration 3 (a
# local abort), so its prealloc queue is empty: unpatched, it skips the handshake poll its peers enter.
HANDSHAKE = {"arrivals": {}, "handshakes": {0: [("req-p", 10_000)]}}


def _retraction(world: int) -> dict[str, Any]:
    return {**RETRACTION, "retracted": {world - 1: [3, 6]}}


def _handshake(world: int) -> dict[str, Any]:
    return {**HANDSHAKE, "local_aborts": {world - 1: {3: "req-p"}}}


# Unpatched, the peers of the diverging rank wait in the poll it skipped: the retraction gate skips the transfer
# poll (the prealloc queue is empty on every rank), the handshake gate the prealloc queue's handshake poll.
RETRACTION_HANGS = Phase.DECODE_TRANSFER_POLL
HANDSHAKE_HANGS = Phase.PREALLOC_HANDSHAKE_POLL
# Every rank skips the polls while any rank holds a retracted request, then all resume together.
RETRACTION_RESUMES = {"dropped": {}, "transferred": {"req-y": 1}, "finished": {"req-y": 4},
                      "collectives_entered": DECODE_LOCKSTEP}
# The exchange shows the holders that the last rank no longer holds `req-p`: it fails its handshake there, and
# every rank has dropped it in the same iteration.
HANDSHAKE_DROPS = {"dropped": {"req-p": 3}, "transferred": {}, "finished": {}, "collectives_entered": DECODE_LOCKSTEP}
GATES = {
    "retraction-world3-unpatched": (3, _retraction, (), RETRACTION_HANGS),
    "retraction-world3-kv-poll-lockstep": (3, _retraction, (LOCKSTEP,), RETRACTION_RESUMES),
    "retraction-world2-unpatched": (2, _retraction, (), RETRACTION_HANGS),
    "retraction-world2-kv-poll-lockstep": (2, _retraction, (LOCKSTEP,), RETRACTION_RESUMES),
    "handshake-world2-unpatched": (2, _handshake, (), HANDSHAKE_HANGS),
    "handshake-world2-kv-poll-lockstep": (2, _handshake, (LOCKSTEP,), HANDSHAKE_DROPS),
    "handshake-world3-unpatched": (3, _handshake, (), HANDSHAKE_HANGS),
    "handshake-world3-kv-poll-lockstep": (3, _handshake, (LOCKSTEP,), HANDSHAKE_DROPS),
}
Outcome = Phase | dict[str, Any]  # where the peers wait (unpatched), or what every rank reports (patched)


@pytest.mark.parametrize(("world", "story", "patches", "outcome"), list(GATES.values()), ids=list(GATES))
def test_a_rank_local_gate_in_front_of_a_decode_poll_desyncs_unless_kv_poll_lockstep_agrees_it(
    launch: Launch, world: int, story: Callable[[int], dict[str, Any]], patches: tuple[str, ...], outcome: Outcome,
) -> None:
    _run_gate(launch, world, story(world), patches, outcome,
              {"Scheduler.process_decode_queue", "DecodePreallocQueue._update_handshake_waiters"})


def _run_gate(launch: Launch, world: int, story: dict[str, Any], patches: tuple[str, ...], outcome: Outcome,
              patched: set[str]) -> None:
    """The last rank diverges at a gate. With a phase for `outcome`, the group must hang and be judged Desync
    (that rank in the broadcast, its peers in that phase, the gate's own poll); with events, every rank
    completes Healthy, `patched` among the functions it ran patched, and reports exactly those events."""
    sc, proc = launch(patches, world, **story)
    if not group.wait_for(lambda: _in_loop(sc)() or proc.poll() is not None, timeout_s=STARTUP_S):
        pytest.fail(f"the ranks did not enter their loop in {STARTUP_S} s:\n{_log(sc)}")
    if isinstance(outcome, Phase):
        _assert_desync_is_detected_in_time(sc, proc, outcome, early=world - 1)
        return
    events = outcome
    _assert_every_rank_completes_healthy(sc, proc)
    for rank in range(sc.world):
        result = json.loads(sc.result_path(rank).read_text())
        assert result["iterations"] == sc.iterations
        assert result["applied"] == [LOCKSTEP]
        assert set(result["patched"]) >= patched
        assert {key: result[key] for key in events} == events, f"rank {rank}"


# --- The prefill loop's rank-local gates in front of a KV poll (docs/desync-audit.md) -----------------------
# Bootstrap: `pop_bootstrapped` returns at once on an empty bootstrap queue. `req-b` waits in every rank's
# bootstrap queue (its bootstrap never completes); the last rank alone releases it at iteration 3, so its queue
# is empty: unpatched, it skips the bootstrap poll its peers enter.
# Inflight: `process_disagg_prefill_inflight_queue` returns at once on an empty inflight queue. `req-i` was
# prefilled at iteration 0 and its transfer never lands; `req-ok`'s lands at iteration 2. The last rank alone
# releases `req-i` at iteration 3: unpatched, it skips the transfer poll its peers enter.
def _bootstrap(world: int) -> dict[str, Any]:
    return {"role": "prefill", "arrivals": {}, "handshakes": {0: [("req-b", 10_000)]},
            "local_aborts": {world - 1: {3: "req-b"}}}


def _inflight(world: int) -> dict[str, Any]:
    return {"role": "prefill", "arrivals": {0: [("req-i", 10_000), ("req-ok", 3)]}, "handshakes": {},
            "local_aborts": {world - 1: {3: "req-i"}}}


# Waiting queue: `resolve_waiting_queue_bootstrap` returns at once when no waiting request is left to poll.
# `held-w` was prefilled optimistically (its bootstrap never completes) but admission never takes it, so it
# waits in every rank's waiting queue; the last rank alone aborts it at iteration 3 (SGLang's abort_request pops
# it there): unpatched, that rank skips the waiting queue's bootstrap poll its peers enter.
# Chunked request: `process_prefill_chunk` calls `check_bootstrap` only while `self.chunked_req is not None`.
# `chunked-c` was prefilled optimistically and is chunked on every rank from iteration 0; the last rank alone
# aborts it at iteration 3 (SGLang's process_pending_chunked_abort clears its chunked request): unpatched, that
# rank skips the chunked request's bootstrap poll its peers enter.
def _waiting(world: int) -> dict[str, Any]:
    return {"role": "prefill", "arrivals": {}, "handshakes": {0: [("held-w", 10_000)]},
            "local_aborts": {world - 1: {3: "held-w"}}}


def _chunked(world: int) -> dict[str, Any]:
    return {"role": "prefill", "arrivals": {}, "handshakes": {0: [("chunked-c", 10_000)]},
            "local_aborts": {world - 1: {3: "chunked-c"}}}


# With kv-poll-lockstep the request a peer lacks is Failed on every rank that holds it (SGLang's own
# handle_bootstrap_failure / handle_inflight_transfer_failure): every rank has dropped it in iteration 3.
# Unpatched, the peers wait in the poll the last rank skipped: its bootstrap queue's, or its inflight queue's.
BOOTSTRAP_DROPS = {"dropped": {"req-b": 3}, "prefilled": {}, "transferred": {}, "collectives_entered": PREFILL_LOCKSTEP}
INFLIGHT_DROPS = {"dropped": {"req-i": 3}, "prefilled": {"req-i": 0, "req-ok": 0}, "transferred": {"req-ok": 2},
                  "collectives_entered": PREFILL_LOCKSTEP}
# With kv-poll-lockstep the last rank's abort shows in the exchange: its peers get Failed for the request it no
# longer holds, and SGLang's handle_bootstrap_failure (through handle_pending_bootstrap for the chunked one, which
# process_prefill_chunk then lets go) retires it: every rank has dropped it in iteration 3.
WAITING_DROPS = {"dropped": {"held-w": 3}, "prefilled": {}, "transferred": {}, "collectives_entered": PREFILL_LOCKSTEP}
CHUNKED_DROPS = {"dropped": {"chunked-c": 3}, "prefilled": {}, "transferred": {},
                 "collectives_entered": PREFILL_LOCKSTEP}
# Each prefill gate: its story, where the peers wait unpatched, what every rank reports patched; at 2 and 3 ranks.
PREFILL_STORIES = (
    ("bootstrap", _bootstrap, Phase.PREFILL_BOOTSTRAP_POLL, BOOTSTRAP_DROPS),
    ("inflight", _inflight, Phase.PREFILL_INFLIGHT_POLL, INFLIGHT_DROPS),
    ("waiting", _waiting, Phase.PREFILL_WAITING_BOOTSTRAP_POLL, WAITING_DROPS),
    ("chunked", _chunked, Phase.PREFILL_CHUNK_BOOTSTRAP_POLL, CHUNKED_DROPS),
)
PREFILL_GATES = {
    f"{name}-world{world}-{LOCKSTEP if patched else 'unpatched'}":
        (world, story, (LOCKSTEP,) if patched else (), drops if patched else hangs)
    for name, story, hangs, drops in PREFILL_STORIES for world in (2, 3) for patched in (False, True)
}


@pytest.mark.parametrize(("world", "story", "patches", "outcome"), list(PREFILL_GATES.values()),
                         ids=list(PREFILL_GATES))
def test_a_rank_local_gate_in_front_of_a_prefill_poll_desyncs_unless_kv_poll_lockstep_agrees_it(
    launch: Launch, world: int, story: Callable[[int], dict[str, Any]], patches: tuple[str, ...], outcome: Outcome,
) -> None:
    _run_gate(launch, world, story(world), patches, outcome,
              {"PrefillBootstrapQueue.pop_bootstrapped", "Scheduler.process_disagg_prefill_inflight_queue",
               "Scheduler.resolve_waiting_queue_bootstrap", "Scheduler.process_prefill_chunk"})
