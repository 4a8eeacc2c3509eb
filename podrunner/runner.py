"""The node agent: watch pdfleet's pods on the local cluster's fake nodes and give each a worker; say on
/healthz whether it can run pods; on SIGTERM stop every pod it runs and exit.

It adopts nothing. A pod that a previous runner started has no process any more (they die with the runner),
so it is marked Failed, as kubelet reports pods after a node reboot, never left Running without a process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from pdfleet.podrunner import status
from pdfleet.podrunner.hosts import HostsView
from pdfleet.podrunner.kube import ApiError
from pdfleet.podrunner.node import Node
from pdfleet.podrunner.pod import PodWorker, deleting
from pdfleet.podrunner.standin import StandIn, simulated
from pdfleet.podrunner.watch import informer

log = logging.getLogger("pdfleet.podrunner.runner")
Body = dict[str, Any]
PART_OF = "app.kubernetes.io/part-of=pdfleet"
NODE_LABEL = "pdfleet.dev/local-cluster=true"
NODE_REFRESH_S = 5.0
NODE_RELIST_S = 0.5  # the least time between two listings of the nodes for pods bound to a node not known
TERMINAL = ("Failed", "Succeeded")


def started_by_a_runner(pod: Body) -> bool:
    return any(str(c.get("containerID", "")).startswith(status.CONTAINER_ID_PREFIX)
               for c in pod.get("status", {}).get("containerStatuses") or [])


def orphan_patch(pod: Body, now: float) -> Body:
    """The status of a pod whose processes died with an earlier runner."""
    message = "pdfleet-sim restarted and its processes did not survive it (as on a node reboot)"
    views = []
    for c in pod["status"].get("containerStatuses") or []:
        running = (c.get("state") or {}).get("running") or {}
        view = status.ContainerView(c["name"], c.get("image", ""), c.get("state") or {},
                                    last_state=c.get("lastState") or {}, restart_count=int(c.get("restartCount", 0)),
                                    container_id=c.get("containerID"))
        if "terminated" not in view.state:
            view.state = status.terminated(code=137, sig=None, started_at=now, finished_at=now,
                                           reason="ContainerStatusUnknown", message=message)
            if running.get("startedAt"):
                view.state["terminated"]["startedAt"] = running["startedAt"]
        views.append(view)
    return status.pod_patch(phase_now="Failed", ready=False, ready_since=now, containers=views,
                            other_conditions=pod["status"].get("conditions") or [], reason="NodeRestart",
                            message=message)


class Runner:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.nodes: set[str] = set()
        self.others: set[str] = set()  # nodes without NODE_LABEL: a real kubelet runs their pods
        self._nodes_listed = 0.0
        self.workers: dict[str, PodWorker | StandIn] = {}
        # Whether the pods of a namespace get processes (`standin`), by namespace, and the pods that wait for
        # their namespace to be looked up (one lookup per namespace, however many pods arrive meanwhile).
        self.simulate: dict[str, bool] = {}
        self._namespace_waiters: dict[str, dict[str, Body]] = {}
        # Pods bound to a node not known yet (the runner may start before the cluster's nodes are created), by
        # uid: only the latest version of each, so an older body never overwrites a newer one once placed.
        self._unplaced: dict[str, Body] = {}
        self._placing: asyncio.Task[None] | None = None
        self._place_again = False
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.synced = asyncio.Event()
        self._handled_terminal: set[str] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self.hosts = HostsView()  # cluster DNS of every pod watched, the part engine groups need

    async def refresh_nodes(self) -> None:
        self._nodes_listed = time.monotonic()
        listing = await self.node.client.list("/api/v1/nodes", {})
        key, value = NODE_LABEL.split("=")
        ours = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(key) == value
                for n in listing["items"]}
        self.nodes = {name for name, mine in ours.items() if mine}
        # Nodes that are someone else's (the local cluster's real kubelet node): their pods are never placed here,
        # so they are not kept waiting for a node listing that would never bring them.
        self.others = {name for name, mine in ours.items() if not mine}

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------------------------- watch events

    def on_upsert(self, pod: Body) -> None:
        # No process of a namespace the runner does not simulate reads its names, and keeping them cost O(pods) a
        # pod event: quadratic over the operator benchmark's 800-pod namespaces, on the cores the benchmark measures.
        if self.simulate.get(pod["metadata"]["namespace"]) is not False and self.hosts.note(pod):
            self._publish_hosts(pod["metadata"]["namespace"])
        node_name = pod["spec"].get("nodeName")
        if not node_name:
            return  # not scheduled yet
        uid = pod["metadata"]["uid"]
        if node_name in self.others:
            return
        if node_name not in self.nodes:
            self._unplaced[uid] = pod
            self._place_later()
            return
        worker = self.workers.get(uid)
        if worker is not None:
            worker.update(pod)
            return
        phase = pod.get("status", {}).get("phase")
        if phase in TERMINAL or (not self.synced.is_set() and started_by_a_runner(pod)):
            self._spawn(self._settle_without_process(pod))
            return
        namespace = pod["metadata"]["namespace"]
        if namespace not in self.simulate:
            self._await_namespace(pod)
            return
        worker = PodWorker(self.node, pod, lambda: self.hosts.text(namespace)) if self.simulate[namespace] \
            else StandIn(self.node, pod)
        self.workers[uid] = worker
        task = asyncio.create_task(worker.run(), name=f"pod {worker.key}")
        self.tasks[uid] = task
        task.add_done_callback(lambda _: self._forget(uid))
        log.info("pod accepted", extra={"fields": {"pod": worker.key, "uid": uid, "node": node_name}})

    def on_delete(self, pod: Body) -> None:
        if self.hosts.forget(pod):
            self._publish_hosts(pod["metadata"]["namespace"])
        self._namespace_waiters.get(pod["metadata"]["namespace"], {}).pop(pod["metadata"]["uid"], None)
        self._unplaced.pop(pod["metadata"]["uid"], None)
        worker = self.workers.get(pod["metadata"]["uid"])
        if worker is not None:
            worker.gone()

    def _publish_hosts(self, namespace: str) -> None:
        """Give the played pods of `namespace` its new view of cluster DNS (only their own namespace's names)."""
        for worker in self.workers.values():
            if isinstance(worker, PodWorker) and worker.pod["metadata"]["namespace"] == namespace:
                worker.write_hosts()

    def on_synced(self) -> None:
        self.synced.set()

    def _forget(self, uid: str) -> None:
        self.workers.pop(uid, None)
        self.tasks.pop(uid, None)

    def _place_later(self) -> None:
        """Lists the nodes again (one listing at a time, another after it if pods arrived meanwhile), then
        takes on the pods that were waiting for their node, each in its latest version."""
        if self._placing is not None and not self._placing.done():
            self._place_again = True
            return
        self._placing = asyncio.create_task(self._place_unplaced())

    async def _place_unplaced(self) -> None:
        self._place_again = True
        while self._place_again and self._unplaced:
            self._place_again = False
            await asyncio.sleep(max(0.0, self._nodes_listed + NODE_RELIST_S - time.monotonic()))
            try:
                await self.refresh_nodes()
            except (ApiError, OSError) as e:
                log.warning("listing nodes failed; retrying", extra={"fields": {"error": str(e)[:200]}})
                self._place_again = True
                await asyncio.sleep(NODE_REFRESH_S)
                continue
            placed = [uid for uid, pod in self._unplaced.items() if pod["spec"].get("nodeName") in self.nodes]
            for uid in placed:
                self.on_upsert(self._unplaced.pop(uid))

    def _await_namespace(self, pod: Body) -> None:
        namespace = pod["metadata"]["namespace"]
        waiting = self._namespace_waiters.setdefault(namespace, {})
        first = not waiting
        waiting[pod["metadata"]["uid"]] = pod  # the latest version of each pod, once
        if first:
            self._spawn(self._look_up_namespace(namespace))

    async def _look_up_namespace(self, namespace: str) -> None:
        path = f"/api/v1/namespaces/{namespace}"
        while namespace not in self.simulate:
            try:
                self.simulate[namespace] = simulated(await self.node.client.request("GET", path))
            except (ApiError, OSError) as e:
                if isinstance(e, ApiError) and e.status == 404:  # gone, and its pods with it
                    self._namespace_waiters.pop(namespace, None)
                    return
                log.warning("reading a namespace failed; retrying",
                            extra={"fields": {"namespace": namespace, "error": str(e)[:200]}})
                await asyncio.sleep(NODE_REFRESH_S)
        for pod in self._namespace_waiters.pop(namespace, {}).values():
            self.on_upsert(pod)

    async def _settle_without_process(self, pod: Body) -> None:
        """A pod with no process here: finished, or orphaned by an earlier runner."""
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        try:
            if pod["status"].get("phase") not in TERMINAL:
                await self.node.client.patch_pod_status(meta["namespace"], meta["name"], meta["uid"],
                                                        orphan_patch(pod, time.time()))
                log.info("orphaned pod marked Failed", extra={"fields": {"pod": key, "uid": meta["uid"]}})
            if deleting(pod) and meta["uid"] not in self._handled_terminal:
                self._handled_terminal.add(meta["uid"])
                await self.node.client.delete_pod_now(meta["namespace"], meta["name"], meta["uid"])
                log.info("pod deleted", extra={"fields": {"pod": key, "uid": meta["uid"], "why": "no process"}})
        except ApiError as e:
            log.warning("settling a pod failed", extra={"fields": {"pod": key, "error": str(e)[:300]}})

    # ------------------------------------------------------------------------------------------ running

    async def serve_health(self, host: str, port: int) -> web.AppRunner:
        async def healthz(_: web.Request) -> web.Response:
            ok = self.node.zygote.ready.is_set() and self.synced.is_set() and not self.node.zygote.died.is_set()
            return web.Response(text="ok" if ok else "starting", status=200 if ok else 503)

        async def pods(_: web.Request) -> web.Response:
            return web.json_response({w.key: {"uid": uid, "containers": {
                c.name: {"pid": c.proc.pid if c.proc else None, "state": next(iter(c.view.state), None),
                         "ready": c.view.ready, "restarts": c.view.restart_count} for c in w.containers}}
                for uid, w in self.workers.items()})

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/pods", pods)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        return runner

    async def run(self) -> None:
        await self.refresh_nodes()
        # Containers need the zygote: do not start pods before it has imported SGLang.
        await self.node.zygote.ready.wait()
        await informer(self.node.client, "/api/v1/pods", {"labelSelector": PART_OF}, on_upsert=self.on_upsert,
                       on_delete=self.on_delete, on_synced=self.on_synced)

    async def stop_all(self) -> None:
        log.info("stopping every pod", extra={"fields": {"pods": len(self.workers)}})
        for worker in list(self.workers.values()):
            worker.stop_for_shutdown()
        tasks = list(self.tasks.values())
        if not tasks:
            return
        # Every process is gone within the shutdown grace; what a worker still does after that is bookkeeping
        # (a status write to an apiserver that may be down), which must never keep the runner from exiting.
        _, late = await asyncio.wait(tasks, timeout=self.node.shutdown_grace_s + 10)
        if late:
            log.warning("pod workers did not finish; cancelling them",
                        extra={"fields": {"workers": sorted(t.get_name() for t in late)}})
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
