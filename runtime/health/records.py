"""`RankRecord`: the decoded, immutable snapshot of one ledger slot."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pdfleet.runtime.health import layout, phases


@dataclasses.dataclass(frozen=True, slots=True)
class RankRecord:
    """One rank as its slot read at one instant.

    `phase_since_ns` and `attached_ns` are on the writer host's monotonic clock: compare them only with a
    `time.monotonic_ns()` taken on the same host (`phase_age_ns`), never across pods. `consistent` is False when
    the reader gave up waiting for a multi-word update to finish (a writer killed in the middle of one
    leaves it so forever); the fields are then a best effort.
    """

    slot: int
    rank: int
    pid: int
    pid_start: int
    loop: phases.LoopName
    phase: phases.Phase
    phase_since_ns: int
    iteration: int
    collectives: int
    stack_signal: int
    attached_ns: int
    consistent: bool = True

    @property
    def exited(self) -> bool:
        """The rank left its event loop cleanly (`RankWriter.close`); `phase_since_ns` is when."""
        return self.phase is phases.Phase.EXITED

    def phase_age_ns(self, now_ns: int) -> int:
        """How long the rank has been in its current phase at `now_ns` (same host's monotonic clock)."""
        return max(0, now_ns - self.phase_since_ns)


def decode(slot: int, words: Sequence[int], *, consistent: bool) -> RankRecord:
    """The record in a slot's words (as `ledger` copies them out)."""
    return RankRecord(
        slot=slot,
        rank=words[layout.RANK],
        pid=words[layout.PID],
        pid_start=words[layout.PID_START],
        loop=phases.LoopName(words[layout.LOOP]),
        phase=phases.Phase(words[layout.PHASE]),
        phase_since_ns=words[layout.PHASE_SINCE],
        iteration=words[layout.ITERATION],
        collectives=words[layout.COLLECTIVES],
        stack_signal=words[layout.STACK_SIGNAL],
        attached_ns=words[layout.ATTACHED_NS],
        consistent=consistent,
    )
