"""What state each engine group is in, judged from its observed pods against its desired pods. Pure."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping, Sequence, Set
from typing import Any

from pdfleet.operator.api.status import ContainerExit
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


MESSAGE_MAX = 2048  # characters of a terminated message kept in status: the end of a log tail says most


def _tail(text: str | None) -> str | None:
    if not text or len(text) <= MESSAGE_MAX:
        return text or None
    tail = text[-MESSAGE_MAX:]
    return tail[tail.find("\n") + 1:] if "\n" in tail[:-1] else tail


def parse_time(value: str | None) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def _terminated(container: Body) -> Body | None:
    for key in ("state", "lastState"):
        terminated = (container.get(key) or {}).get("terminated")
        if terminated:
            return terminated
    return None


def ended_exit(pods: list[Body]) -> ContainerExit | None:
    """How the first ended pod (by name) of a group ended: the first of its containers that failed (or, if none
    failed, that ended), from its terminated state; the pod's own reason when no container ended."""
    for pod in sorted((p for p in pods if pod_ended(p)), key=lambda p: p["metadata"]["name"]):
        status = pod.get("status") or {}
        ended = [(c.get("name"), t) for c in status.get("containerStatuses") or []
                 if (t := _terminated(c)) is not None]
        failed = [(name, t) for name, t in ended if t.get("exitCode", 0) != 0] or ended
        if failed:
            container, t = failed[0]
            return ContainerExit(pod=pod["metadata"]["name"], container=container, reason=t.get("reason"),
                                 exit_code=t.get("exitCode"), message=_tail(t.get("message")),
                                 finished_at=parse_time(t.get("finishedAt")))
        return ContainerExit(pod=pod["metadata"]["name"], reason=status.get("reason") or status.get("phase"),
                             message=_tail(status.get("message")))
    return None


def leader_pod(pods: Sequence[Body]) -> Body | None:
    """The group's rank-0 pod among `pods` (the one whose engine serves HTTP), None when there is none. Pods
    from before ranks were labelled count as rank 0."""
    return next((p for p in pods if (p["metadata"].get("labels") or {}).get(labels.RANK, "0") == "0"), None)


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
