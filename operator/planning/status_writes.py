"""Status and conditions as pure functions of what was planned and observed.

`lastTransitionTime` moves only when a condition's status flips, so recomputing an unchanged status gives an
identical object and nothing is written.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from pdfleet.operator.api.conditions import Condition, ConditionStatus, ConditionType
from pdfleet.operator.api.status import InferencePoolStatus

Body = dict[str, Any]


def parse_status(raw: Mapping[str, Any] | None) -> InferencePoolStatus:
    """The pool's current status; a status this operator cannot read counts as none."""
    try:
        return InferencePoolStatus.model_validate(raw or {})
    except ValidationError:
        return InferencePoolStatus()


def condition(
    previous: Iterable[Condition],
    type_: ConditionType,
    status: bool | ConditionStatus,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: datetime.datetime,
) -> Condition:
    value = status if isinstance(status, ConditionStatus) else ConditionStatus.TRUE if status else \
        ConditionStatus.FALSE
    before = next((c for c in previous if c.type == type_), None)
    moved = before is None or before.status != value
    return Condition(
        type=str(type_),
        status=value,
        observed_generation=generation,
        last_transition_time=now if moved else before.last_transition_time,  # type: ignore[union-attr]
        reason=reason,
        message=message,
    )


def holds(previous: Iterable[Condition], type_: ConditionType, status: ConditionStatus, reason: str,
          message: str) -> bool:
    """The previous conditions already say this (same status, reason and message): nothing new to announce."""
    return any(c.type == type_ and (c.status, c.reason, c.message) == (status, reason, message) for c in previous)


def merge_conditions(previous: Iterable[Condition], updated: Iterable[Condition]) -> tuple[Condition, ...]:
    """pdfleet's conditions in a fixed order, then any other writer's conditions untouched."""
    ours = {c.type: c for c in updated}
    order = [str(t) for t in ConditionType]
    kept = [c for c in previous if c.type not in ours]
    return tuple(sorted(ours.values(), key=lambda c: order.index(c.type) if c.type in order else 99)) + tuple(kept)


def wire(status: InferencePoolStatus) -> Body:
    return status.model_dump(mode="json")


def changed(new: InferencePoolStatus, raw_previous: Mapping[str, Any] | None) -> bool:
    """Compares in the wire form the apiserver stores, so defaults and ordering cannot cause a write."""
    return wire(new) != wire(parse_status(raw_previous)) or raw_previous is None


def news(raw_previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether a new status (wire form) says something a reader waits for, beyond progress: its phase, the
    generation or revisions it speaks of, or any condition's status or reason. Counts, messages and the groups'
    details alone are progress (a group Ready, then the next): the executor may coalesce those writes."""
    before = raw_previous or {}
    if any(before.get(k) != new.get(k) for k in ("phase", "observedGeneration", "currentRevision", "updateRevision")):
        return True

    def said(status: Mapping[str, Any]) -> set[tuple[Any, Any, Any]]:
        return {(c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or []}

    return said(before) != said(new)


def merge_patch(raw_previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns the stored status `raw_previous` into `new`: `new` itself, with a
    null for every key the stored status has and `new` leaves out, in nested objects too (lists are replaced
    whole). The wire form leaves out what is unset, and a merge patch keeps what it does not name: without the
    nulls, a field once set (a role's surgeUnschedulable, the routers, the watch) would stay in the stored status
    for good, and every plan would find it there and write again."""
    out: dict[str, Any] = dict(new)
    for key, old in (raw_previous or {}).items():
        if key not in new:
            out[key] = None
        elif isinstance(old, Mapping) and isinstance(new[key], Mapping):
            out[key] = merge_patch(old, new[key])
    return out
