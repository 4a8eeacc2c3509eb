"""Why an engine group whose pods exist but do not run is waiting: for Kueue to admit its gang (its pods carry
Kueue's admission gate: none binds or holds a GPU until the whole group is admitted), or, admitted or not
gang-scheduled, for a node (kube-scheduler found none), or, placed, for an image its node cannot pull. Said in
the group's status message, and once in an Event when the group starts waiting (a Warning for an image: no
wait ends that by itself). Pure.

Why Kueue has not admitted a gang is on its Workload (condition QuotaReserved=False: quota short in the queue,
no such LocalQueue, no topology domain with room), not on the pods; `reasons` carries what was read there, by
Kueue group name, when the operator could read it (kube/kueue.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pdfleet.operator.api.status import GroupStatus, InferencePoolStatus
from pdfleet.operator.planning.plan import Event
from pdfleet.operator.render import gang, labels

Body = dict[str, Any]
FOR_GANG = "waiting for Kueue to admit its gang"
FOR_NODE = "waiting for a node"
FOR_IMAGE = "waiting for an image"
EVENT_REASON = "GroupWaiting"
IMAGE_EVENT_REASON = "ImagePullFailed"
# The kubelet's waiting reasons of a container whose image it could not get (pkg/kubelet/images/types.go).
PULL_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                           "RegistryUnavailable", "ErrImageInspect", "SignatureValidationFailed"})
# Kueue v0.17's QuotaReserved=False message when its scheduler found no room for the gang: quota short in the
# queue's flavors or no topology domain that holds it (pkg/scheduler/flavorassigner Assignment.Message). Other
# refusals (no such or an inactive queue, a namespace the ClusterQueue does not select) are no shortage of room.
NO_ROOM = "couldn't assign flavors to pod set"
# ...unless Kueue is making room by preempting other workloads (pkg/scheduler/scheduler.go): it admits then.
MAKING_ROOM = "Pending the preemption"


def gated(pod: Body) -> bool:
    return any(g.get("name") == gang.ADMISSION_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def gang_name(pods: Iterable[Body]) -> str | None:
    """The Kueue group (and Workload) name the group's pods carry, if they are gang-scheduled."""
    return next((n for p in pods if (n := (p["metadata"].get("labels") or {}).get(gang.GROUP_LABEL))), None)


def held_gangs(pods: Iterable[Body]) -> set[str]:
    """The Kueue groups (Workload names) of the pods Kueue holds at its admission gate."""
    return {n for p in pods if gated(p) and not p["metadata"].get("deletionTimestamp")
            and (n := (p["metadata"].get("labels") or {}).get(gang.GROUP_LABEL))}


def stranded(pods: Iterable[Body]) -> list[Body]:
    """The pool's pods being deleted that Kueue's finalizer would keep for ever, and that hold nothing: those Kueue
    never admitted (still at its admission gate, never bound), and those whose containers have all ended (phase
    Succeeded or Failed). Kueue v0.17 keeps its finalizer on the deleted pods of a serving group once the group's
    Workload is gone: after it deleted the Workload of a group it never admitted, and when the Workload was
    deleted beside the pods (a namespace deleted with its pools, measured: its pods stayed Terminating and the
    namespace with them). A group's replacement (a rollout, a fixed queue name) would wait for them for ever too.
    Such a pod holds no quota, no node and no process: the operator takes the finalizer off (kube/kueue.py). A
    pod still running is left to Kueue, which releases it when the pod stops."""
    return [p for p in pods if p["metadata"].get("deletionTimestamp") and _kept_by_kueue_for_nothing(p)]


def stranded_with_its_namespace(pod: Body) -> bool:
    """Whether a pod the operator last saw before its namespace's deletion began would be `stranded`: the operator
    then hears of it once more, as deleted, with the body it last saw (operator/kopf_fixes.py), and never again.
    A pod really gone never carries a finalizer, so only such a pod can be both deleted and held by Kueue."""
    return _kept_by_kueue_for_nothing(pod)


def _kept_by_kueue_for_nothing(pod: Body) -> bool:
    return gang.FINALIZER in (pod["metadata"].get("finalizers") or []) and (
        (gated(pod) and not (pod.get("spec") or {}).get("nodeName"))
        or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"))


def unscheduled(pods: list[Body]) -> str | None:
    """The scheduler's message when a pod of the group could not be placed (PodScheduled False, Unschedulable)."""
    for pod in pods:
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and \
                    cond.get("reason") == "Unschedulable":
                return str(cond.get("message") or "no node fits it")
    return None


def image_pull(pods: list[Body]) -> str | None:
    """The first container (init containers first) whose image its node could not pull: which pod, which
    container, which image, and the kubelet's reason and message."""
    for pod in pods:
        status = pod.get("status") or {}
        for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (c.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in PULL_FAILURES:
                detail = f": {waiting['message']}" if waiting.get("message") else ""
                return (f"container {c.get('name')} of pod {pod['metadata'].get('name')} (image {c.get('image')}): "
                        f"{waiting['reason']}{detail}")
    return None


def no_room(pods: list[Body], reasons: Mapping[str, str]) -> str | None:
    """Kueue's reason when it holds the group's gang for want of room (quota or a topology domain), not for a
    queue it cannot find or while it preempts to make room; None otherwise. `reasons`: as for `message`."""
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if not any(gated(p) for p in live):
        return None
    why = reasons.get(gang_name(live) or "")
    return why if why and NO_ROOM in why and MAKING_ROOM not in why else None


def message(pods: list[Body], size: int, reasons: Mapping[str, str] | None = None) -> str | None:
    """Why a group whose pods are not all running waits, or None when it does not wait on placement."""
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    waiting = [p for p in live if gated(p)]
    if waiting:
        pod_labels = waiting[0]["metadata"].get("labels") or {}
        queue = pod_labels.get(gang.QUEUE_LABEL, "")
        name = gang_name(waiting) or ""
        why = (reasons or {}).get(name)
        # The field that names the queue, so a queue Kueue does not know is traced to the spec that asked for it.
        field = f"spec.{pod_labels.get(labels.ROLE, '<role>')}.scheduling.gang.queueName"
        return (f"{FOR_GANG} of {size} pod(s) in queue {queue} ({field}; Workload {name})" +
                (f": {why}" if why else "; no pod of it binds or holds a GPU until all are admitted"))
    if (why := unscheduled(live)) is not None:
        return f"{FOR_NODE}: {why}"
    if (why := image_pull(live)) is not None:
        return f"{FOR_IMAGE}: {why}"
    return None


def is_waiting(text: str | None) -> bool:
    return bool(text) and (FOR_GANG in text or FOR_NODE in text or FOR_IMAGE in text)


def _for_image(text: str | None) -> bool:
    return bool(text) and FOR_IMAGE in str(text)


def events(groups: Iterable[GroupStatus], previous: InferencePoolStatus) -> list[Event]:
    """One Event per group that waits now and did not at the last status (an operator restart posts none); a
    Warning when what it waits for is an image, which no wait brings (the kubelet retries, with backoff, what
    someone must fix), once however often the kubelet's reason turns between ErrImagePull and ImagePullBackOff."""
    before = {g.name: g.message for g in previous.groups}
    out = []
    for g in groups:
        if _for_image(g.message) and not _for_image(before.get(g.name)):
            out.append(Event("Warning", IMAGE_EVENT_REASON, f"group {g.name} {g.message}"))
        elif is_waiting(g.message) and not _for_image(g.message) and not is_waiting(before.get(g.name)):
            out.append(Event("Normal", EVENT_REASON, f"group {g.name} {g.message}"))
    return out
