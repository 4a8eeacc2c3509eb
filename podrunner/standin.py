"""Pods the runner stands in for without starting a process: those of a namespace labelled
`pdfleet.dev/simulate=false`.

Load tests of the operator (benchmarks/bench_operator.py) create hundreds of engine pods; running each as a
simulated engine would take more CPU than a small machine has and measure the machine instead of the operator.
In such a namespace a pod turns Running and Ready as soon as kwok has given it an IP (as kwok plays every pod
that is not pdfleet's), and is deleted at once when it is deleted (no process to stop, so no grace to wait).
The label is read once per namespace, when the runner first sees one of its pods.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from pdfleet.podrunner import status
from pdfleet.podrunner.kube import ApiError, Replaced
from pdfleet.podrunner.node import Node
from pdfleet.podrunner.pod import deleting

log = logging.getLogger("pdfleet.podrunner.standin")
Body = dict[str, Any]
SIMULATE_LABEL = "pdfleet.dev/simulate"


def simulated(namespace: Body) -> bool:
    """Whether the runner starts processes for the pods of this namespace (anything but `false`: yes)."""
    return (namespace["metadata"].get("labels") or {}).get(SIMULATE_LABEL) != "false"


def ready_patch(pod: Body, now: float) -> Body:
    """Every container running and ready, every init container done: what kwok writes for other pods."""
    spec = pod["spec"]
    containers = [status.ContainerView(c["name"], c.get("image", ""), status.running(now), ready=True, started=True)
                  for c in spec["containers"]]
    inits = [status.ContainerView(c["name"], c.get("image", ""),
                                  status.terminated(code=0, sig=None, started_at=now, finished_at=now), ready=True)
             for c in spec.get("initContainers") or []]
    return status.pod_patch(phase_now="Running", ready=True, ready_since=now, containers=containers,
                            init_containers=inits, other_conditions=(pod.get("status") or {}).get("conditions") or [])


class StandIn:
    """A pod worker with no process: the same interface as `pod.PodWorker`, for the runner's bookkeeping."""

    containers: tuple[()] = ()

    def __init__(self, node: Node, pod: Body) -> None:
        self.client = node.client
        self.pod = pod
        self.key = "{namespace}/{name}".format_map(pod["metadata"])
        self.changed = asyncio.Event()
        self.stopped = False  # the pod object is gone, or the runner stops: either way nothing is left to do

    def update(self, pod: Body) -> None:
        self.pod = pod
        self.changed.set()

    def gone(self) -> None:
        self.stopped = True
        self.changed.set()

    stop_for_shutdown = gone

    async def _until(self, done: Callable[[], object]) -> bool:
        """Waits until `done()` holds; False when the pod went away or the runner stops first."""
        while not done():
            if self.stopped:
                return False
            self.changed.clear()
            await self.changed.wait()
        return True

    async def run(self) -> None:
        meta = self.pod["metadata"]
        try:
            # kwok gives the pod its IP and turns it Running first; a patch before that would keep kwok from it.
            if await self._until(lambda: self.pod["status"].get("podIP") or deleting(self.pod)) \
                    and not deleting(self.pod):
                await self.client.patch_pod_status(meta["namespace"], meta["name"], meta["uid"],
                                                   ready_patch(self.pod, time.time()))
            if await self._until(lambda: deleting(self.pod)):
                await self.client.delete_pod_now(meta["namespace"], meta["name"], meta["uid"])
        except ApiError as e:
            if e.status != 404 and not isinstance(e, Replaced):
                log.warning("standing in for a pod failed", extra={"fields": {"pod": self.key, "error": str(e)[:300]}})
