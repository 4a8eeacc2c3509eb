"""`spec.health`: how the operator judges rank health and what it does about a sick engine group.

Verdicts come from the per-rank ledgers (see docs/architecture.md): a group whose ranks are blocked in different
collectives for `desyncAfter` is in Desync; one whose ranks all sit in the same collective without progress for
`hangAfter` is in Hang. Either way the operator captures evidence first, then restarts the whole group. A group
whose pod ended is restarted the same way, its exit as the evidence. Every restart, whatever its cause, waits out
the backoff and counts against one budget, `restartBudget.count` per `restartBudget.window`; past it the group is
left for a person (`budgetExhausted`) until they delete its pods or change the spec.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule
from pdfleet.operator.api.scalars import DURATION_PATTERN, Duration, parse_duration


def _longer(a: str, b: str) -> bool:
    return parse_duration(a) > parse_duration(b)


def _when_set(*fields: str, rule: str) -> str:
    """Guards a duration rule. has(): the apiserver checks a `default: {}` against the rules before it fills in
    nested defaults, so a rule must hold while its fields are absent. matches(): a malformed duration is already
    refused by its pattern, and duration() on it would only add a confusing type-conversion error."""
    guards = [f"!has(self.{field})" for field in fields]
    guards += [f"!self.{field}.matches('{DURATION_PATTERN}')" for field in fields]
    return " || ".join([*guards, f"({rule})"])


class RestartBudget(ApiModel):
    """At most `count` group restarts per sliding `window`."""

    count: Annotated[int, Field(ge=0, le=100)] = Field(
        default=3, description="Restarts allowed per window, whatever their cause (an ended pod, Desync, Hang, "
                               "Dead); past them the group is left for a person. 0 never restarts (detect and "
                               "report only)."
    )
    window: Duration = Field(default="1h", description="Sliding window the count applies to.")


_BACKOFF_GROWS = Rule(
    cel=_when_set("max", "initial", rule="duration(self.max) >= duration(self.initial)"),
    holds=lambda b: not _longer(b.initial, b.max),
    message="backoff.max must be at least backoff.initial",
    field=".max",
)


class Backoff(ApiModel):
    """Delay before restarting a group, doubling from `initial` up to `max` while restarts repeat."""

    RULES = (_BACKOFF_GROWS,)

    initial: Duration = Field(
        default="10s",
        description="Least time between a group's restart and its next one; doubles with each restart in the "
                    "budget window. The first restart of a group is not delayed: a hung or ended engine serves nobody.",
    )
    max: Duration = Field(default="5m", description="Longest delay between restarts.")


class Evidence(ApiModel):
    """What to capture from a sick group before restarting it."""

    rank_records: bool = Field(default=True, description="Keep every rank's health record (phase, counters).")
    stacks: bool = Field(default=True, description="Capture every rank's Python stacks (py-spy style dump).")
    keep: Annotated[int, Field(ge=0, le=100)] = Field(
        default=5, description="Evidence bundles kept per pool; the oldest is dropped first."
    )


_DESYNC_AFTER_A_HEARTBEAT = Rule(
    cel=_when_set("desyncAfter", "heartbeatPeriod",
                  rule="duration(self.desyncAfter) > duration(self.heartbeatPeriod)"),
    holds=lambda h: _longer(h.desync_after, h.heartbeat_period),
    message="desyncAfter must be longer than heartbeatPeriod",
    field=".desyncAfter",
)
_HANG_AFTER_A_HEARTBEAT = Rule(
    cel=_when_set("hangAfter", "heartbeatPeriod", rule="duration(self.hangAfter) > duration(self.heartbeatPeriod)"),
    holds=lambda h: _longer(h.hang_after, h.heartbeat_period),
    message="hangAfter must be longer than heartbeatPeriod",
    field=".hangAfter",
)


class HealthSpec(ApiModel):
    """Rank-health policy."""

    RULES = (_DESYNC_AFTER_A_HEARTBEAT, _HANG_AFTER_A_HEARTBEAT)

    heartbeat_period: Duration = Field(default="5s", description="How often the operator polls rank agents.")
    desync_after: Duration = Field(
        default="30s", description="Ranks blocked in different collectives this long make the group Desync."
    )
    hang_after: Duration = Field(
        default="10m",
        description="Ranks blocked in the same collective without progress this long make the group Hang. "
                    "Longer than the slowest legitimate forward.",
    )
    restart_budget: RestartBudget = Field(default_factory=RestartBudget, description="Restart limit per window.")
    backoff: Backoff = Field(default_factory=Backoff, description="Delay between restarts of a group.")
    evidence: Evidence = Field(default_factory=Evidence, description="What to capture before a restart.")
