"""What state each engine group is in, judged from its observed pods against its desired pods. Pure."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Set
from typing import Any

from pdfleet.operator.cache import ObjectKey
from pdfleet.operator.render import labels
from pdfleet.operator.render.desired import DesiredGroup
from pdfleet.operator.render.stamp import applied_hash

Body = dict[str, Any]


class GroupState(enum.StrEnum):
    MISSING = "Missing"  # no pod exists (or all are on their way)
    PARTIAL = "Partial"  # some pods of the group exist, some do not
    STARTING = "Starting"  # every pod exists at the desired revision; not all are Ready yet
    READY = "Ready"  # every pod exists at the desired revision and is Ready
    OUTDATED = "Outdated"  # some pod was rendered from another spec or operator version
    FAILED = "Failed"  # some pod ended (Failed or Succeeded): the group must restart as a unit
    TERMINATING = "Terminating"  # some pod is being deleted; wait for it to go


@dataclasses.dataclass(frozen=True)
class Expectations:
    """What this operator wrote that the watch may not show yet (see `controller.Controller`)."""

    applied: Mapping[ObjectKey, str] = dataclasses.field(default_factory=dict)  # key -> content hash
    deleting: Set[ObjectKey] = frozenset()


def pod_ready(pod: Body) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def pod_ended(pod: Body) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


def pods_by_group(pods: list[Body]) -> dict[str, list[Body]]:
    out: dict[str, list[Body]] = {}
    for pod in pods:
        group = (pod["metadata"].get("labels") or {}).get(labels.GROUP)
        if group:
            out.setdefault(group, []).append(pod)
    return out


def classify(desired: DesiredGroup, observed: list[Body], expect: Expectations) -> GroupState:
    by_name = {p["metadata"]["name"]: p for p in observed}
    present = 0
    ready = 0
    for want in desired.pods:
        name = want["metadata"]["name"]
        key = ("Pod", name)
        pod = by_name.get(name)
        if key in expect.deleting or (pod is not None and pod["metadata"].get("deletionTimestamp")):
            return GroupState.TERMINATING
        if pod is None:
            if expect.applied.get(key) == applied_hash(want):
                present += 1  # created a moment ago; the watch has not shown it yet
            continue
        if pod_ended(pod):
            return GroupState.FAILED
        if applied_hash(pod) != applied_hash(want):
            return GroupState.OUTDATED
        present += 1
        ready += pod_ready(pod)
    if present == 0:
        return GroupState.MISSING
    if present < len(desired.pods):
        return GroupState.PARTIAL
    return GroupState.READY if ready == len(desired.pods) else GroupState.STARTING
