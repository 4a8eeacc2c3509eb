"""What one reconcile will do: the output of the pure planner, the input of the executor."""

from __future__ import annotations

import dataclasses
from typing import Any

from pdfleet.operator.planning.spec_change import SpecChange

Body = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Event:
    """A Kubernetes Event about the pool, to be posted by the executor."""

    type: str  # Normal or Warning
    reason: str  # UpperCamelCase, e.g. GroupCreated
    message: str
    # The writes this event reports: if any of them fails, the event is not posted (it would not be true).
    about: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    uid: str | None = None
    # Seconds the object's pods get to stop (None: their own terminationGracePeriodSeconds).
    grace_period_seconds: int | None = None


@dataclasses.dataclass(frozen=True)
class Restart:
    """A group restarted as a unit by this plan: why (a `RestartCause`), and the pods deleted for it."""

    group: str
    cause: str
    pods: tuple[tuple[str, str], ...]  # (kind, name) of each pod deleted


@dataclasses.dataclass(frozen=True)
class Analysis:
    """A group's bake, judged: `result` passed, failed or timed_out, after `seconds` of baking."""

    group: str
    result: str
    seconds: float


@dataclasses.dataclass(frozen=True)
class Plan:
    apply: tuple[Body, ...] = ()  # desired objects that differ from what the cluster has
    delete: tuple[ObjectRef, ...] = ()  # owned objects no longer desired
    status: Body | None = None  # the new status, or None when it would not change
    events: tuple[Event, ...] = ()
    rejected: bool = False  # the spec failed a check: nothing in the fleet was planned
    # Evidence to capture before a restart (`restarts.EvidenceRequest`), and the groups restarted, with why.
    capture: tuple[Any, ...] = ()
    restarted: tuple[Restart, ...] = ()
    # Seconds until a group's restart backoff is over: plan again then (no watch event will come to say so).
    requeue_after: float | None = None
    # Changes to the pool's own object (its spec, its annotations), sent after the status; an Event whose `about`
    # names the pool ("InferencePool", name) is not posted if one of them is refused (the spec moved on).
    pool_changes: tuple[SpecChange, ...] = ()
    # Bakes judged in this plan, for the operator's metrics.
    analyses: tuple[Analysis, ...] = ()

    @property
    def status_only(self) -> bool:
        """Nothing to do but write the status: no object, no Event, no restart, no change to the pool."""
        return not (self.apply or self.delete or self.events or self.capture or self.pool_changes or self.restarted
                    or self.analyses or self.rejected)

    @property
    def empty(self) -> bool:
        return not (self.apply or self.delete or self.status is not None or self.events or self.capture
                    or self.pool_changes)
