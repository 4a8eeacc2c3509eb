"""A slow rank and a killed rank in the reproduction harness, as pdfleet's verdict judges them.

The ranks run the default story of tests/unit/test_desync_reproduction.py on real gloo groups of two and three
(tests/repro), with a fault of one rank's own process injected at the start of an iteration, before intake
(tests/repro/rank_hooks.py):
- a straggler shorter than `desyncAfter` (0.6 s late in five iterations): with the fix patches the group is
  Healthy in every sampled verdict and every rank reports what the run without a straggler reports; unpatched,
  the story's own divergence is still judged Desync, naming the same collectives;
- a straggler longer than `desyncAfter` (3.5 s late once): the ranks stand at different positions for longer
  than `desyncAfter`, so the verdict is Desync while it lags (that is what the verdict means: `desyncAfter` must
  exceed the worst straggle), and Healthy again as soon as it catches up (the judge keeps no state); the run
  completes as without it;
- a rank SIGKILLed at an iteration: Dead, naming it, within a poll. Gloo's TCP transport sees the dead rank's
  connections reset, so its peers' next collective raises and they die too (as SGLang's scheduler process
  would on that exception); the killed rank is the one behind, outside the collective its peers entered.
"""

from __future__ import annotations

import json
import signal

import pytest

from pdfleet.runtime.health import phases, verdict
from tests.repro import group
from tests.repro.scenario import Scenario, early_rank
from tests.unit import test_desync_reproduction as repro  # the harness's verdict checks and their constants
from tests.unit.test_desync_reproduction import Launch

Phase = phases.Phase
Health = verdict.Health
FIXES = (repro.LOCKSTEP, repro.CONSENSUS)
SHORT_S, LONG_S = 0.6, 3.5
# Late across the story's local aborts (iterations 3 and 5) and the drop they lead to (iteration 6).
SHORT_STRAGGLE = dict.fromkeys(range(2, 7), SHORT_S)
LONG_AT = 10  # after the drop, so the straggle is the only thing that happens while it lasts
KILL_AT = 6


def _started(start: Launch, patches: tuple[str, ...], world: int,
             **story: object) -> tuple[Scenario, group.Launcher]:
    sc, proc = start(patches, world, **story)
    if not group.wait_for(lambda: repro._in_loop(sc)() or proc.poll() is not None, timeout_s=repro.STARTUP_S):
        pytest.fail(f"the ranks did not enter their loop in {repro.STARTUP_S} s:\n{repro._log(sc)}")
    return sc, proc


def _finished(v: verdict.Verdict, sc: Scenario) -> bool:
    return any(r.iteration >= sc.iterations or r.phase is Phase.EXITED for r in v.ranks)


# The root of the request broadcast in a group of two, the rank whose clock fires first in a group of three.
SHORT_CASES = {"world2-rank0": (2, 0), "world3-early-rank": (3, early_rank(3))}
# The outcome without a straggler, measured here in a group of two (test_desync_reproduction's `world3-both`
# measures it in a group of three): what a straggler must leave unchanged.
BASELINE = {"world2-no-straggler": (2, None)}


@pytest.mark.parametrize(("world", "straggler"), [*SHORT_CASES.values(), *BASELINE.values()],
                         ids=[*SHORT_CASES, *BASELINE])
def test_a_straggler_shorter_than_desync_after_stays_healthy_and_changes_nothing(
    launch: Launch, world: int, straggler: int | None
) -> None:
    straggle = {} if straggler is None else {straggler: SHORT_STRAGGLE}
    sc, proc = _started(launch, FIXES, world, straggle=straggle)
    repro._assert_every_rank_completes_and_drops_together(sc, proc, repro.BOTH_DROP)
    if straggler is not None:
        late = json.loads(sc.result_path(straggler).read_text())["iteration_ns"]
        assert all(late[i] >= SHORT_S * 1e9 for i in SHORT_STRAGGLE), "the straggle must have happened"


@pytest.mark.parametrize(("world", "straggler"), list(SHORT_CASES.values()), ids=list(SHORT_CASES))
def test_a_straggler_does_not_mask_the_unpatched_desync(
    launch: Launch, world: int, straggler: int
) -> None:
    sc, proc = _started(launch, (), world, straggle={straggler: SHORT_STRAGGLE})
    repro._assert_desync_is_detected_in_time(sc, proc, Phase.DECODE_TRANSFER_POLL)


LONG_CASES = {"world2-rank1": (2, 1), "world3-rank0": (3, 0)}


@pytest.mark.parametrize(("world", "straggler"), list(LONG_CASES.values()), ids=list(LONG_CASES))
def test_a_straggler_longer_than_desync_after_is_desync_while_it_lags_then_healthy_again(
    launch: Launch, world: int, straggler: int
) -> None:
    sc, proc = _started(launch, FIXES, world, straggle={straggler: {LONG_AT: LONG_S}})
    samples = group.watch(sc.ledger, sc.world, repro.POLICY, period_s=repro.PERIOD_S, deadline_s=60.0,
                          until=lambda v: _finished(v, sc) or proc.poll() is not None)
    assert proc.wait(timeout=60) == 0, repro._log(sc)
    judged = [s for s in samples if not _finished(s.verdict, sc)]
    healths = [s.verdict.health for s in judged]
    assert set(healths) == {Health.HEALTHY, Health.DESYNC}, [s.verdict.reason for s in judged]
    first = healths.index(Health.DESYNC)
    last = len(healths) - 1 - healths[::-1].index(Health.DESYNC)
    assert set(healths[first:last + 1]) == {Health.DESYNC}, "one lag, one unbroken stretch of Desync"
    assert last + 1 < len(healths), "the run must be watched Healthy again after the straggler catches up"

    # While it lags: the straggler in its local work, one collective behind its peers waiting in the broadcast.
    lagging = judged[first].verdict
    ranks = {v.rank: v for v in lagging.ranks}
    peers = [r for r in range(world) if r != straggler]
    assert ranks[straggler].phase is Phase.LOCAL and ranks[straggler].iteration == LONG_AT
    assert {ranks[r].phase for r in peers} == {Phase.RECV_BROADCAST}
    assert {ranks[r].collectives for r in peers} == {ranks[straggler].collectives + 1}

    # Times on this host's monotonic clock: the straggle began at the straggler's phase start.
    began_ns = judged[first].at_ns - ranks[straggler].phase_age_ns
    to_desync_s = (judged[first].at_ns - began_ns) / 1e9
    to_healthy_s = (judged[last + 1].at_ns - began_ns) / 1e9 - LONG_S
    print(f"straggle {LONG_S} s: Desync after {to_desync_s:.2f} s, Healthy {to_healthy_s:.2f} s after it ended "
          f"(desyncAfter {repro.DESYNC_AFTER_S} s, sampled every {repro.PERIOD_S} s)")
    assert repro.DESYNC_AFTER_S < to_desync_s <= repro.DESYNC_AFTER_S + repro.PERIOD_S + repro.JITTER_S
    assert 0 < to_healthy_s <= repro.PERIOD_S + repro.JITTER_S
    for rank in range(world):
        result = json.loads(sc.result_path(rank).read_text())
        assert result["dropped"] == {"req-x": repro.BOTH_DROP.drop_iteration}, "the straggle changed the outcome"
        assert result["finished"] == {"req-y": sc.decode_steps}


KILL_CASES = {
    "decode-world2": (2, "decode", 1),
    "decode-world3": (3, "decode", 2),
    "prefill-world2": (2, "prefill", 0),
    "prefill-world3": (3, "prefill", 1),
}


@pytest.mark.parametrize(("world", "role", "killed"), list(KILL_CASES.values()), ids=list(KILL_CASES))
def test_a_killed_rank_is_judged_dead_not_desync_nor_hang(
    launch: Launch, world: int, role: str, killed: int
) -> None:
    sc, proc = _started(launch, FIXES, world, role=role, kill_at={killed: KILL_AT})
    samples = group.watch(sc.ledger, sc.world, repro.POLICY, period_s=repro.PERIOD_S, deadline_s=30.0,
                          until=lambda v: v.health is not Health.HEALTHY)
    before, dead = samples[:-1], samples[-1]
    assert dead.verdict.health is Health.DEAD, f"{dead.verdict}\n{repro._log(sc)}"
    assert {s.verdict.health for s in before} <= {Health.HEALTHY}, [s.verdict.reason for s in before]

    ranks = {v.rank: v for v in dead.verdict.ranks}
    gone = [r for r, v in ranks.items() if v.status is verdict.RankStatus.DEAD]
    named = f"rank {killed}" if gone == [killed] else f"ranks {','.join(map(str, gone))}"
    assert killed in gone and dead.verdict.reason == f"{named}: process gone"
    assert ranks[killed].iteration == KILL_AT and not ranks[killed].phase.is_collective
    # Its peers are where it left them, or in the broadcast it never joined (where gloo tells them it is gone).
    for rank in set(ranks) - {killed}:
        position = (ranks[rank].phase, ranks[rank].collectives)
        assert position[1] == ranks[killed].collectives or position == (Phase.RECV_BROADCAST,
                                                                        ranks[killed].collectives + 1), position

    # It died at most one forward (or idle pause) after its last phase began; the verdict needs one poll.
    to_dead_s = ranks[killed].phase_age_ns / 1e9
    print(f"{role} world {world}: rank {killed} killed at iteration {KILL_AT}; Dead {to_dead_s:.2f} s after its "
          f"last phase began (sampled every {repro.PERIOD_S} s): {dead.verdict.reason}")
    assert to_dead_s <= repro.PERIOD_S + repro.JITTER_S + max(sc.forward_s, sc.idle_s)

    # The launcher reports the first failure, the kill, as a shell would. The peers do not block: their next
    # collective with the dead rank raises, and they are gone too.
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL, repro._log(sc)
    after = verdict.judge(group.views(sc.ledger, sc.world), repro.POLICY)
    assert after.health is Health.DEAD and {v.status for v in after.ranks} == {verdict.RankStatus.DEAD}


def test_straggle_and_kill_at_name_ranks_inside_the_group_and_cross_as_json() -> None:
    sc = Scenario(port=1, ledger="ledger", workdir="work", world=3, local_aborts={},
                  straggle={2: {4: 0.6, 9: 3.5}}, kill_at={1: 6})
    assert Scenario.from_json(sc.to_json()) == sc
    with pytest.raises(ValueError, match=r"ranks \[3\] outside a group of 3"):
        Scenario(port=1, ledger="ledger", workdir="work", world=3, local_aborts={}, straggle={3: {1: 0.6}})
    with pytest.raises(ValueError, match=r"ranks \[-1\] outside a group of 3"):
        Scenario(port=1, ledger="ledger", workdir="work", world=3, local_aborts={}, kill_at={-1: 2})
