"""Faults of a rank's own process, injected at the start of an iteration, before intake: a straggler and a kill.

Neither is a divergence of the collectives: a straggler enters the same collectives late, a killed rank enters
none. They show what pdfleet's verdict makes of them (a straggle shorter than `desyncAfter` is Healthy, a
longer one Desync while it lasts; a killed rank is Dead), next to the desyncs the other stories inject.
"""

from __future__ import annotations

import os
import signal
import time

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from tests.repro import scenario as scenario_mod


def before_intake(sc: scenario_mod.Scenario, rank: int, iteration: int, rank_writer: seams.Writer) -> None:
    """`sc.kill_at`: this rank dies here as the OOM killer or a crash would end it, without a word to its
    ledger record or its peers. `sc.straggle`: this rank is late by that many seconds, in rank-local work (a
    slow rank's extra time is its own, not a collective's), so its peers wait for it in the next broadcast."""
    if sc.kill_at.get(rank) == iteration:
        os.kill(os.getpid(), signal.SIGKILL)
    late_s = sc.straggle.get(rank, {}).get(iteration, 0.0)
    if late_s > 0:
        rank_writer.begin(phases.Phase.LOCAL)
        time.sleep(late_s)  # the work that makes it late: nothing to wait for
