"""What rank-health verdicts mean for the pool: the Degraded condition and the Events of a transition. Pure.

Events are derived from the status transition (the previous status against the new one), never from the
poll that saw it, so they are posted exactly once per transition even when reconciles repeat or the
operator restarts: a transition already written to status is not a transition any more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pdfleet.operator.api.status import GroupStatus, InferencePoolStatus, Verdict
from pdfleet.operator.planning.health.rank_health import SICK
from pdfleet.operator.planning.plan import Event

# A rank-health failure that gets its own Warning (Unreachable is reported by the Degraded condition only:
# an agent that does not answer says nothing about the ranks).
ALARMS = {Verdict.DESYNC: "GroupDesync", Verdict.HANG: "GroupHang", Verdict.DEAD: "GroupDead"}
_PRIORITY = (Verdict.DEAD, Verdict.DESYNC, Verdict.HANG, Verdict.UNREACHABLE)


@dataclasses.dataclass(frozen=True)
class Degraded:
    status: bool
    reason: str
    message: str


def degraded(groups: Sequence[GroupStatus], failed: Sequence[str]) -> Degraded:
    """Degraded=True names every failed or sick group with why; the reason is the worst kind present: a group
    left for a person (its restart budget spent), a failed pod, then dead ranks, desync, hang, an unreachable
    agent."""
    troubled = [g for g in groups if g.name in failed or g.verdict in SICK]
    if not troubled:
        return Degraded(False, "AsExpected", "no group has failed and every rank agent that answered is healthy")
    parts = [f"{g.name} {'failed' if g.name in failed else g.verdict}: {g.message}" for g in troubled]
    if any(g.budget_exhausted for g in troubled):
        reason = "RestartBudgetExhausted"
    elif failed:
        reason = "GroupFailed"
    else:
        worst = next(v for v in _PRIORITY if any(g.verdict is v for g in troubled))
        reason = SICK[worst]
    return Degraded(True, reason, "; ".join(parts))


def transition_events(previous: InferencePoolStatus, groups: Sequence[GroupStatus]) -> list[Event]:
    """A Warning when a group falls into Desync, Hang or Dead (its evidence as the message), a Normal
    GroupRecovered when a group that was in one of them is Healthy again."""
    before = {g.name: g.verdict for g in previous.groups}
    events = []
    for group in groups:
        was = before.get(group.name, Verdict.UNKNOWN)
        if group.verdict is was:
            continue
        if group.verdict in ALARMS:
            events.append(Event("Warning", ALARMS[group.verdict],
                                f"{group.role} group {group.name} is in {group.verdict}: {group.message}"))
        elif group.verdict is Verdict.HEALTHY and was in ALARMS:
            events.append(Event("Normal", "GroupRecovered",
                                f"{group.role} group {group.name} recovered from {was}: {group.message}"))
    return events


def exhausted_events(previous: InferencePoolStatus, groups: Sequence[GroupStatus]) -> list[Event]:
    """One Warning when a group's restart budget runs out (the status remembers, so it is posted once)."""
    before = {g.name: g.budget_exhausted for g in previous.groups}
    return [Event("Warning", "RestartBudgetExhausted",
                  f"{g.role} group {g.name} needs a restart ({g.restart_cause}) and is left for a person: {g.message}")
            for g in groups if g.budget_exhausted and not before.get(g.name, False)]


def backoff_events(previous: InferencePoolStatus, groups: Sequence[GroupStatus]) -> list[Event]:
    """One Warning when a group starts waiting out a restart backoff (a new `nextRestartTime`)."""
    before = {g.name: g.next_restart_time for g in previous.groups}
    return [Event("Warning", "GroupRestartBackOff",
                  f"{g.role} group {g.name} needs a restart ({g.restart_cause}); backing off until "
                  f"{g.next_restart_time:%Y-%m-%dT%H:%M:%SZ}: {g.message}")
            for g in groups if g.next_restart_time is not None and before.get(g.name) != g.next_restart_time]
