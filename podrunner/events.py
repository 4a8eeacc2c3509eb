"""Pod events as kubelet posts them (Started, Killing, Unhealthy, BackOff, ...), fire and forget: an event
that cannot be written is logged, never allowed to hold up the pod."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from pdfleet.podrunner.kube import Client
from pdfleet.podrunner.status import timestamp

log = logging.getLogger("pdfleet.podrunner.events")
COMPONENT = "pdfleet-sim"


def event_body(pod: dict[str, Any], container: str | None, reason: str, message: str, kind: str,
               now: float) -> dict[str, Any]:
    meta = pod["metadata"]
    involved: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                "namespace": meta["namespace"], "uid": meta["uid"]}
    if container:
        involved["fieldPath"] = f"spec.containers{{{container}}}"
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
        "involvedObject": involved, "reason": reason, "message": message, "type": kind,
        "source": {"component": COMPONENT, "host": pod["spec"].get("nodeName", "")},
        "reportingComponent": COMPONENT, "reportingInstance": pod["spec"].get("nodeName", ""),
        "firstTimestamp": timestamp(now), "lastTimestamp": timestamp(now), "count": 1,
    }


class Recorder:
    def __init__(self, client: Client) -> None:
        self.client = client
        self._tasks: set[asyncio.Task[None]] = set()

    def emit(self, pod: dict[str, Any], container: str | None, reason: str, message: str,
             kind: str = "Normal") -> None:
        body = event_body(pod, container, reason, message, kind, time.time())
        task = asyncio.create_task(self._post(pod["metadata"]["namespace"], body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, namespace: str, body: dict[str, Any]) -> None:
        try:
            await self.client.create_event(namespace, body)
        except Exception as e:  # an event is a courtesy; the pod's status is the truth
            log.warning("event not written", extra={"fields": {"reason": body["reason"], "error": str(e)[:200]}})
