"""`judge`: the health of one engine group, from what each of its ranks reported. Pure: no I/O, no clock.

Why the judge needs no memory of earlier polls. Progress means iterations advance, and every iteration
enters at least one phase (`RankWriter.begin` or `collective`), which restamps the phase start. So "this
rank has been in its phase for T" already says "this rank made no progress for T", measured by the rank's
own host at the instant of the read, at a finer grain than comparing iteration counters between two polls
ever could. The judge therefore gives the right answer on the first poll after an operator restart and
carries no state between calls. Iterations are kept as evidence.

Ages, not timestamps, cross the boundary: a group with `nodesPerGroup > 1` spans hosts whose monotonic
clocks are unrelated, so each agent turns its ranks' phase start times into ages on its own clock
(`report.rank_views`) and only durations reach the judge.

The rules, in order:
- Stopped: a rank left its loop cleanly (its record's last phase is EXITED). A rank exits cleanly only when
  its engine was told to shut down (SGLang's ShutdownReq after a SIGTERM drain), so the group is being
  stopped on purpose, whatever its other ranks show meanwhile: a peer not yet out of its loop, one killed
  by the shutdown's own clean-up before it wrote its exit, or an agent already gone with its pod. Not sick:
  what comes next is the pod's business (it ends, and is replaced or restarted as an ended pod).
- Dead: a rank's process is gone without a clean exit (a crash, SIGKILL, the OOM killer). Unreachable: its
  pod's agent did not answer. (Facts first.)
- Starting: a rank has no record yet, or has not entered its event loop.
- A rank's position is (phase, collectives entered). The group's configuration has been frozen for
  `held` = the smallest phase age among its ranks: nothing anywhere moved for that long.
- Desync: the ranks are not all at one position, and that has held for longer than `desync_after`.
  (A healthy group is often caught mid-step at different positions, but only for the moment it takes the
  stragglers to catch up, so `held` stays short.)
- Hang: all ranks at one position inside a collective, held for longer than `hang_after`.
- Otherwise Healthy, even when every rank has sat in the same forward for minutes: slow but consistent.
  A forward that never ends is the engine watchdog's business, not a desync.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Iterable

from pdfleet.runtime.health import phases

_NS_PER_S = 1_000_000_000


class RankStatus(enum.StrEnum):
    """What the operator knows about one expected rank."""

    REPORTING = "reporting"  # its agent returned its record and its process is alive
    ABSENT = "absent"  # its agent answered, but the rank never attached to the ledger
    DEAD = "dead"  # its agent answered, and the process that wrote its record is gone without a clean exit
    EXITED = "exited"  # its record ends in a clean exit (EXITED), whether or not the process has ended yet
    UNREACHABLE = "unreachable"  # the agent of its pod did not answer


class Health(enum.StrEnum):
    HEALTHY = "Healthy"
    STARTING = "Starting"
    DESYNC = "Desync"
    HANG = "Hang"
    DEAD = "Dead"
    UNREACHABLE = "Unreachable"
    STOPPED = "Stopped"


@dataclasses.dataclass(frozen=True, slots=True)
class RankView:
    """One rank as observed in one poll. `phase_age_ns` was computed on the rank's own host."""

    rank: int
    status: RankStatus
    phase: phases.Phase = phases.Phase.UNKNOWN
    phase_age_ns: int = 0
    collectives: int = 0
    iteration: int = 0
    loop: phases.LoopName = phases.LoopName.UNKNOWN
    pid: int = 0

    @property
    def position(self) -> tuple[phases.Phase, int]:
        """Where the rank stands in the sequence of collectives all ranks must make together."""
        return (self.phase, self.collectives)


@dataclasses.dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Thresholds, from the pool's `spec.health`. `desync_after` must exceed the longest rank-local pause
    the engine takes legitimately (for example an idle sleep), `hang_after` the longest collective wait."""

    desync_after_ns: int
    hang_after_ns: int

    def __post_init__(self) -> None:
        if self.desync_after_ns <= 0 or self.hang_after_ns <= 0:
            raise ValueError(f"thresholds must be positive: {self}")

    @classmethod
    def from_seconds(cls, *, desync_after: float, hang_after: float) -> HealthPolicy:
        return cls(desync_after_ns=round(desync_after * _NS_PER_S), hang_after_ns=round(hang_after * _NS_PER_S))


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """The group's health, one sentence why, and the evidence: every rank as it was seen, by rank.
    `held_ns` is how long the ranks' configuration had been frozen (0 when it cannot be told)."""

    health: Health
    reason: str
    held_ns: int
    ranks: tuple[RankView, ...]


def judge(ranks: Iterable[RankView], policy: HealthPolicy) -> Verdict:
    """The verdict for one group from one poll of all its expected ranks."""
    views = tuple(sorted(ranks, key=lambda v: v.rank))
    if not views:
        return Verdict(Health.STARTING, "no ranks observed yet", 0, views)

    exited = [v for v in views if v.status is RankStatus.EXITED]
    if exited:
        return Verdict(Health.STOPPED, _stopped(exited, views), 0, views)

    for status, health, what in (
        (RankStatus.DEAD, Health.DEAD, "process gone"),
        (RankStatus.UNREACHABLE, Health.UNREACHABLE, "agent not answering"),
    ):
        hit = [v for v in views if v.status is status]
        if hit:
            return Verdict(health, f"{_ranks(hit)}: {what}", 0, views)

    waiting = [v for v in views if v.status is RankStatus.ABSENT or v.phase is phases.Phase.STARTING]
    if waiting:
        return Verdict(Health.STARTING, f"{_ranks(waiting)}: not in the event loop yet", 0, views)

    held = min(v.phase_age_ns for v in views)
    groups = _by_position(views)
    if len(groups) > 1:
        where = "; ".join(_describe(members) for members in groups)
        if held > policy.desync_after_ns:
            return Verdict(Health.DESYNC, f"ranks diverged for {_secs(held)}: {where}", held, views)
        return Verdict(Health.HEALTHY, f"ranks between steps ({_secs(held)}): {where}", held, views)

    phase = views[0].phase
    if phase.is_collective and held > policy.hang_after_ns:
        reason = f"all {len(views)} ranks blocked for {_secs(held)}: {_describe(views)}"
        return Verdict(Health.HANG, reason, held, views)
    return Verdict(Health.HEALTHY, f"all ranks together for {_secs(held)}: {_describe(views)}", held, views)


_OTHERS = {
    RankStatus.REPORTING: "still in the loop",
    RankStatus.ABSENT: "never attached",
    RankStatus.DEAD: "process gone",
    RankStatus.UNREACHABLE: "agent not answering",
}


def _stopped(exited: list[RankView], views: tuple[RankView, ...]) -> str:
    """Which ranks exited cleanly, then where the others are, by status (no ages: the text stays put)."""
    parts = [f"{_ranks(exited)}: exited cleanly"]
    for status, what in _OTHERS.items():
        if hit := [v for v in views if v.status is status]:
            parts.append(f"{_ranks(hit)}: {what}")
    return "; ".join(parts)


def _by_position(views: tuple[RankView, ...]) -> list[list[RankView]]:
    """Ranks grouped by position, most advanced collective count first."""
    ordered = sorted(views, key=lambda v: (-v.collectives, v.phase, v.rank))
    return [list(g) for _, g in itertools.groupby(ordered, key=lambda v: v.position)]


def _describe(members: list[RankView] | tuple[RankView, ...]) -> str:
    first = members[0]
    return (
        f"{_ranks(members)} in {first.phase.label} at collective {first.collectives} "
        f"(iteration {', '.join(sorted({str(m.iteration) for m in members}, key=int))})"
    )


def _ranks(views: list[RankView] | tuple[RankView, ...]) -> str:
    numbers = ",".join(str(v.rank) for v in views)
    return f"rank {numbers}" if len(views) == 1 else f"ranks {numbers}"


def _secs(ns: int) -> str:
    return f"{ns / _NS_PER_S:.1f}s"
