"""Writes of the pool's own objects that the apiserver refused for good, and what the pool's status says of them.

A 4xx answer to a create, patch or delete the operator planned (a ResourceQuota, a LimitRange, an admission
policy, an invalid value) will be the same answer on every retry until a person changes something: retrying it
with backoff only hides it. The executor reports it instead: `Accepted=False` (reason `WriteRefused`) with the
apiserver's message, the phase `Degraded`, and a Warning event when a write is refused that the pool's status
did not already name, not one per reconcile. The next reconcile (any event, or the resync) tries again and,
once the write goes through, the planner's `Accepted=True` replaces the condition. What may pass on its own is
retried with backoff as before: 5xx and connection errors, 409 conflicts (the object changed under us), 408 and
429 (the apiserver is busy). A 404 on a delete never gets here: the object is gone, which is what was asked.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pdfleet.operator.api.conditions import Condition, ConditionType
from pdfleet.operator.api.status import Phase
from pdfleet.operator.planning import status_writes
from pdfleet.operator.planning.plan import Event

Body = dict[str, Any]

REASON = "WriteRefused"
RETRIED_4XX = frozenset({408, 409, 429})  # timeout, conflict, throttled: the same write may pass later
MAX_LISTED = 3  # refusals spelled out in the condition; the rest are counted
MAX_TARGETS = 10  # refused objects named in the headline
MAX_MESSAGE = 1024  # of one refusal's apiserver message


def is_refusal(code: int) -> bool:
    """A status code that retrying the same write cannot change."""
    return 400 <= code < 500 and code not in RETRIED_4XX


@dataclasses.dataclass(frozen=True)
class Refusal:
    """One refused write: what was asked (`apply` or `delete`) of which object, and the apiserver's answer."""

    verb: str
    kind: str
    name: str
    code: int
    reason: str
    message: str

    def __str__(self) -> str:
        message = self.message if len(self.message) <= MAX_MESSAGE else self.message[:MAX_MESSAGE] + "..."
        return f"{self.verb} {self.kind} {self.name}: {self.code} {self.reason}: {message}"


def _targets(refusals: Sequence[Refusal]) -> list[str]:
    return sorted({f"{r.verb} {r.kind} {r.name}" for r in refusals})


def _headline(refusals: Sequence[Refusal]) -> str:
    """Which writes were refused, in a stable order (writes go out together and fail in any order)."""
    targets = _targets(refusals)
    more = f" and {len(targets) - MAX_TARGETS} more" if len(targets) > MAX_TARGETS else ""
    named = ", ".join(targets[:MAX_TARGETS])
    return f"the apiserver refused {len(targets)} write(s) of the pool's objects ({named}{more})"


# What `_headline` wrote: the targets it named, then how many it left out.
_NAMED = re.compile(r"the apiserver refused \d+ write\(s\) of the pool's objects "
                    r"\((?P<named>[^()]*?)(?: and \d+ more)?\): ")


def _named(message: str) -> frozenset[str]:
    """The refused writes a WriteRefused condition's message names (not those it only counts)."""
    match = _NAMED.match(message)
    return frozenset(match["named"].split(", ")) if match else frozenset()


def describe(refusals: Sequence[Refusal]) -> str:
    """The headline, then the apiserver's answers to the first few."""
    ordered = sorted(refusals, key=lambda r: (r.verb, r.kind, r.name))
    listed = "; ".join(str(r) for r in ordered[:MAX_LISTED])
    more = f"; and {len(ordered) - MAX_LISTED} more" if len(ordered) > MAX_LISTED else ""
    return f"{_headline(refusals)}: {listed}{more}"


def refused_status(pool: Mapping[str, Any], planned: Body | None, refusals: Sequence[Refusal],
                   now: datetime.datetime) -> tuple[Body | None, tuple[Event, ...]]:
    """The status to write after `refusals` (None when the pool already says exactly this), from the one the
    planner computed (`planned`, None when it saw no change) and the Warning to post (none if already said)."""
    message = describe(refusals)
    status, before = not_accepted(pool, planned, REASON, message, now)
    # A Warning says which writes are refused; it is news only when one of them was not said already. The
    # apiserver's wording varies from one try to the next (a quota's usage), and some writes of a refused set
    # may pass before the rest (a quota raised while a reconcile's writes are in flight): neither is news.
    # The same set again is said too when it is too long to name in full (its headline only counts the rest).
    said = before is not None and before.status == "False" and before.reason == REASON and (
        before.message.startswith(_headline(refusals) + ": ") or set(_targets(refusals)) <= _named(before.message))
    events = () if said else (Event("Warning", REASON, message),)
    return status, events


def not_accepted(pool: Mapping[str, Any], planned: Body | None, reason: str, message: str,
                 now: datetime.datetime) -> tuple[Body | None, Condition | None]:
    """The status that says `Accepted=False` (`reason`, `message`) and phase Degraded, from the one the planner
    computed (`planned`, None when it saw no change), or None when the pool already says exactly this; and the
    pool's Accepted condition before it, from which the caller tells whether its Warning is news."""
    current = status_writes.parse_status(pool.get("status"))
    base = status_writes.parse_status(planned) if planned is not None else current
    cond = status_writes.condition(current.conditions, ConditionType.ACCEPTED, False, reason, message,
                                generation=pool["metadata"].get("generation"), now=now.replace(microsecond=0))
    new = base.model_copy(update={"phase": Phase.DEGRADED,
                                  "conditions": status_writes.merge_conditions(base.conditions, [cond])})
    before = next((c for c in current.conditions if c.type == ConditionType.ACCEPTED), None)
    return (status_writes.wire(new) if status_writes.changed(new, pool.get("status")) else None), before
