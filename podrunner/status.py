"""Pod status as kubelet reports it, pure: container states, the pod phase and conditions, and the patch
that writes them: a JSON merge patch on the status subresource that carries whole lists (conditions,
containerStatuses), so that a container's old state never lingers beside its new one.
"""

from __future__ import annotations

import dataclasses
import datetime
import signal
from collections.abc import Sequence
from typing import Any

Body = dict[str, Any]
CONTAINER_ID_PREFIX = "pdfleet-sim://"  # marks a status written by a runner (kwok's has no containerID)
MESSAGE_MAX_BYTES = 2048  # kubelet's cap on a termination message taken from the log
MESSAGE_MAX_LINES = 80


def timestamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def waiting(reason: str, message: str = "") -> Body:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def running(started_at: float) -> Body:
    return {"running": {"startedAt": timestamp(started_at)}}


def exit_code(code: int | None, sig: int | None) -> int:
    """A process killed by a signal reports 128+signal, as a container runtime does."""
    return 128 + sig if sig else int(code or 0)


def terminated(*, code: int | None, sig: int | None, started_at: float, finished_at: float, message: str = "",
               reason: str | None = None, container_id: str | None = None) -> Body:
    status = exit_code(code, sig)
    body: Body = {"exitCode": status, "reason": reason or ("Completed" if status == 0 else "Error"),
                  "startedAt": timestamp(started_at), "finishedAt": timestamp(finished_at)}
    if sig:
        body["signal"] = sig
        body["message"] = message or f"killed by {signal.Signals(sig).name}"
    elif message:
        body["message"] = message
    if container_id:
        body["containerID"] = container_id
    return {"terminated": body}


def log_tail(text: str) -> str:
    """FallbackToLogsOnError: the last lines of the log, within kubelet's limits."""
    lines = text.rstrip("\n").splitlines()[-MESSAGE_MAX_LINES:]
    tail = "\n".join(lines).encode()[-MESSAGE_MAX_BYTES:]
    return tail.decode(errors="replace")


@dataclasses.dataclass
class ContainerView:
    """What the runner knows of one container, in the shape of a containerStatus."""

    name: str
    image: str
    state: Body
    last_state: Body = dataclasses.field(default_factory=dict)
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    container_id: str | None = None

    def to_status(self) -> Body:
        body: Body = {"name": self.name, "image": self.image, "imageID": "", "state": self.state,
                      "lastState": self.last_state, "ready": self.ready, "started": self.started,
                      "restartCount": self.restart_count}
        if self.container_id:
            body["containerID"] = self.container_id
        return body

    @property
    def is_terminated(self) -> bool:
        return "terminated" in self.state

    @property
    def failed(self) -> bool:
        return self.is_terminated and self.state["terminated"]["exitCode"] != 0


def phase(restart_policy: str, containers: Sequence[ContainerView]) -> str:
    """kubelet's getPhase for a pod whose init containers are done."""
    if not all(c.is_terminated for c in containers):
        return "Running"
    if restart_policy == "Always":
        return "Running"  # about to be restarted
    if any(c.failed for c in containers):
        return "Running" if restart_policy == "OnFailure" else "Failed"
    return "Succeeded"


def condition(kind: str, status: bool, since: float, reason: str = "", message: str = "") -> Body:
    body: Body = {"type": kind, "status": "True" if status else "False", "lastProbeTime": None,
                  "lastTransitionTime": timestamp(since)}
    if reason:
        body["reason"] = reason
    if message:
        body["message"] = message
    return body


def pod_patch(*, phase_now: str, ready: bool, ready_since: float, containers: Sequence[ContainerView],
              init_containers: Sequence[ContainerView] = (), other_conditions: Sequence[Body] = (),
              reason: str = "", message: str = "") -> Body:
    """The status patch for the whole pod. Ready and ContainersReady move together: pdfleet pods have no
    readiness gates."""
    unready = [c.name for c in containers if not c.ready]
    why = ("", "") if ready else ("ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]")
    if phase_now in ("Failed", "Succeeded"):
        why = ("PodCompleted", "")
    status: Body = {
        "phase": phase_now,
        "conditions": [*(c for c in other_conditions if c.get("type") not in ("Ready", "ContainersReady")),
                       condition("Ready", ready, ready_since, *why),
                       condition("ContainersReady", ready, ready_since, *why)],
        "containerStatuses": [c.to_status() for c in containers],
    }
    if init_containers:
        status["initContainerStatuses"] = [c.to_status() for c in init_containers]
    status["reason"] = reason or None  # None deletes a stale reason in a merge patch
    status["message"] = message or None
    return {"status": status}
