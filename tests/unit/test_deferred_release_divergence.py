"""A divergence injected at `all_reduce_flags`: one decode rank holds a deferred release its peers do not.

`DecodeTransferQueue.resolve_deferred_releases` returns at once on an empty `_deferred_releases` and otherwise
MIN-reduces the entries' readiness with `all_reduce_flags`: SGLang keeps that list equal on every rank by
appending to it only from the agreed `held` reduction (docs/desync-audit.md, item 5 of the rank-local list). The
reproduction (tests/repro, scenario `held_releases`) breaks that on purpose: from iteration 2 the last rank
alone holds an entry that never drains, as a release held on one rank only would. SGLang's own
`process_decode_queue` then takes that rank alone into the flag reduction while its peers go on to the next
broadcast: a hang pdfleet reports as Desync naming `deferred_release_flags`. No catalogue patch changes this,
because no 0.5.23 path appends on one rank only; the case the desync fixes do create, a transfer dropped on the
ranks that still held it, keeps its pages on a rank-local list of its own for that reason
(`pdfleet.runtime.patches.impl.dropped_holds`, tests/unit/test_dropped_holds.py). With every fix installed the
injected divergence is still reported (there gloo first pairs the holder's one-flag reduction with its peers'
one-int retraction agreement, which has the same size, so the group hangs one step later).
"""

from __future__ import annotations

import pytest

from pdfleet.runtime.health import phases, verdict
from tests.repro import group
from tests.support import requires
from tests.unit.test_desync_reproduction import PERIOD_S, POLICY, STARTUP_S, Launch, _in_loop, _log

ALL_FIXES = ("kv-poll-lockstep", "abort-consensus", "health-check-consensus", "retraction-consensus",
             "admission-consensus")


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("patches", [(), ALL_FIXES], ids=["unpatched", "all-fixes"])
def test_a_release_held_on_one_rank_only_desyncs_the_group_in_the_flag_reduction(
        launch: Launch, world: int, patches: tuple[str, ...]) -> None:
    requires.installed("sglang")
    sc, proc = launch(patches, world, iterations=12, arrivals={}, local_aborts={}, held_releases={world - 1: 2},
                      forward_s=0.01, idle_s=0.01)
    if not group.wait_for(lambda: _in_loop(sc)() or proc.poll() is not None, timeout_s=STARTUP_S):
        pytest.fail(f"the ranks did not enter their loop in {STARTUP_S} s:\n{_log(sc)}")
    assert proc.poll() is None, f"the run ended before the injected divergence:\n{_log(sc)}"
    samples = group.watch(sc.ledger, sc.world, POLICY, period_s=PERIOD_S, deadline_s=30.0,
                          until=lambda v: v.health not in (verdict.Health.HEALTHY, verdict.Health.STARTING))
    last = samples[-1].verdict
    assert last.health is verdict.Health.DESYNC, f"{last.reason}\n{_log(sc)}"
    assert proc.poll() is None, "the ranks must still be hanging, not have failed"
    ranks = {v.rank: v for v in last.ranks}
    holder, peers = ranks[world - 1], [ranks[r] for r in range(world - 1)]
    if not patches:
        # The holder waits in the flag reduction; its peers went on to the next broadcast (with three ranks gloo
        # may pair one peer's broadcast with the holder's reduction first, so peers can stand a collective apart).
        assert holder.phase is phases.Phase.DEFERRED_RELEASE_FLAGS
        assert {p.phase for p in peers} == {phases.Phase.RECV_BROADCAST}
        assert f"rank {world - 1} in deferred_release_flags" in last.reason
    else:
        # With the fixes, the peers' next collective is the retraction gate's one-int all-reduce: gloo pairs the
        # holder's one-flag reduction with it (same size, no error), and the group hangs one step later, the
        # holder in the gate and its peers in the handshake exchange. Still Desync, at different collectives.
        assert holder.phase not in {p.phase for p in peers}
        assert holder.phase.is_collective and all(p.phase.is_collective for p in peers)
