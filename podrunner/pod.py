"""One played pod, from the moment kwok gives it an IP until its object is deleted: its state directory,
its containers, its status, its termination. kubelet's pod worker, for pdfleet's pods only."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdfleet.podrunner import commands, env, hosts, podinfo, probes, status, tokens
from pdfleet.podrunner.container import Container
from pdfleet.podrunner.kube import ApiError, Replaced
from pdfleet.podrunner.node import Node

log = logging.getLogger("pdfleet.podrunner.pod")
OWNER = ".uid"  # in a pod directory: the uid of the pod that uses it
Body = dict[str, Any]
CONFIG_ERROR = "CreateContainerConfigError"


class Refused(Exception):
    """The pod asks for something the runner does not emulate, or that is not there yet (`retry`: a Secret, ConfigMap
    or key its env refers to, which kubelet keeps retrying for); the message goes into its status."""

    def __init__(self, message: str, *, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


# How soon a pod refused for a missing Secret or ConfigMap key is prepared again: kubelet retries
# CreateContainerConfigError on its pod syncs; doubling from 1 s up to 10 s keeps a pool waiting on a Secret from
# waiting long once it exists.
CONFIG_RETRY_S = (1.0, 10.0)


def deleting(pod: Body) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


class PodWorker:
    def __init__(self, node: Node, pod: Body, hosts_text: Callable[[], str] = lambda: hosts.render([])) -> None:
        self.node = node
        self.pod = pod
        self.hosts_text = hosts_text  # the pod's namespace's view of cluster DNS, as the runner sees it now
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.key = f"{meta['namespace']}/{meta['name']}"
        self.dir = node.pod_dir(meta["namespace"], meta["name"])
        self.changed = asyncio.Event()
        self.dirty = asyncio.Event()
        self.removed = False  # the object is gone from the API (force-deleted, say)
        self.shutdown = False  # the runner itself stops
        self.containers: list[Container] = []
        self.refusal: str | None = None
        self.prepared = False
        self._ready: bool | None = None
        self._ready_since = self._created = time.time()
        self._written: Body | None = None
        self._final: tuple[str, str] | None = None  # (reason, message) of a runner shutdown

    # ------------------------------------------------------------------------------------ from the watch

    def update(self, pod: Body) -> None:
        self.pod = pod
        if self.prepared:
            podinfo.write_annotations(self.dir / "podinfo", pod["metadata"].get("annotations") or {})
        self.changed.set()

    def write_hosts(self) -> None:
        """Refresh the pod's view of cluster DNS (its namespace's pod names), once its directory is ready."""
        if self.prepared:
            podinfo.write_atomically(self.dir / "podinfo" / hosts.HOSTS_FILE, self.hosts_text())

    def gone(self) -> None:
        self.removed = True
        self.changed.set()

    def stop_for_shutdown(self) -> None:
        self.shutdown = True
        self.changed.set()

    def _fields(self, **more: Any) -> dict[str, Any]:
        return {"fields": {"pod": self.key, "uid": self.uid, **more}}

    async def _next_change(self) -> None:
        self.changed.clear()
        await self.changed.wait()

    # ---------------------------------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        writer: asyncio.Task[None] | None = None
        try:
            while not self.pod.get("status", {}).get("podIP"):
                if self.removed or self.shutdown:
                    return
                if deleting(self.pod):
                    await self._delete_object()
                    return
                await self._next_change()
            writer = asyncio.create_task(self._writer())
            claimed = (self.pod["status"]["podIP"], str(self.dir))
            if held := self.node.claims.others(claimed, self.uid):
                log.info("waiting for an earlier pod's processes to stop", extra=self._fields(held=held))
            async with self.node.claims.held(claimed, self.uid):
                await self._play()
            await self._flush()
            if not self.removed and not self.shutdown:
                await self._delete_object()
        except Exception:
            log.exception("pod worker failed", extra=self._fields())
        finally:
            if writer:
                writer.cancel()
            self._cleanup()

    async def _play(self) -> None:
        """Runs the pod's containers until the pod goes; returns once every process of the pod is gone."""
        if self._ending():
            return  # deleted while it waited for its IP: nothing to start
        await self._prepare_until_ready()
        self.dirty.set()
        running = [asyncio.create_task(c.run()) for c in self.containers] if not self._ending() else []
        while not self._ending():
            await self._next_change()
        await self._terminate()
        await asyncio.gather(*running, return_exceptions=True)

    async def _prepare_until_ready(self) -> None:
        """Prepares the pod; refused for what may yet appear (a Secret's or ConfigMap's key), again after a growing
        delay, as kubelet does, until it is there or the pod goes. Each distinct refusal is an Event once."""
        delay = CONFIG_RETRY_S[0]
        while True:
            try:
                await self._prepare()
                if self.refusal is not None:
                    self.refusal = None
                    self.dirty.set()
                return
            except Refused as e:
                self.containers.clear()
                if str(e) != self.refusal:
                    log.warning("pod refused", extra=self._fields(reason=str(e)))
                    self.node.events.emit(self.pod, None, "Failed", f"Error: {e}", "Warning")
                self.refusal = str(e)
                self.dirty.set()
                if not e.retry:
                    return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._next_change(), timeout=delay)
            if self._ending():
                return
            delay = min(delay * 2, CONFIG_RETRY_S[1])

    def _ending(self) -> bool:
        return deleting(self.pod) or self.removed or self.shutdown

    async def _prepare(self) -> None:
        for sub in ("shm", "podinfo", "tmp"):
            shutil.rmtree(self.dir / sub, ignore_errors=True)  # a new pod of an old name starts empty
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "shm").chmod(0o1777)
        (self.dir / OWNER).write_text(self.uid)  # which pod of this name the directory belongs to now
        podinfo.write_annotations(self.dir / "podinfo", self.pod["metadata"].get("annotations") or {})
        self.prepared = True
        self.write_hosts()
        kubeconfig = None
        if tokens.wants_token(self.pod):
            try:
                kubeconfig = str(await tokens.write_pod_kubeconfig(self.node.client, self.pod, self.dir / "kubeconfig"))
            except ApiError as e:
                raise Refused(f"no ServiceAccount token for the pod: {e}") from None
        spec = self.pod["spec"]
        pod_ip = self.pod["status"]["podIP"]
        contract = env.contract_env(pod_ip=pod_ip, pod_dir=str(self.dir), kubeconfig=kubeconfig)
        base = env.base_env(path=self.node.container_path, home=str(self.dir),
                            hostname=spec.get("hostname") or self.pod["metadata"]["name"])
        sources = await self._sources(env.referenced(spec["containers"]))
        for c in spec["containers"]:
            try:
                # kubelet expands $(VAR) in command and args from the container's own env only.
                plan = commands.plan(c, pod_ip=pod_ip, python=self.node.python,
                                     variables=env.container_env(self.pod, c, sources))
                variables = env.build(self.pod, c, base=base, contract=contract, sources=sources)
                if any(m.get("mountPath") == "/tmp" for m in c.get("volumeMounts") or []):
                    variables["TMPDIR"] = str(self.dir / "tmp")
                probe_specs = probes.parse(c)
            except env.MissingKey as e:
                raise Refused(f"container {c['name']}: {e}", retry=True) from None
            except (commands.CommandError, env.EnvError, probes.UnsupportedProbe) as e:
                raise Refused(f"container {c['name']}: {e}") from None
            self.containers.append(Container(self.node, lambda: self.pod, c, plan, variables, probe_specs,
                                             self.dir, self.dirty.set))

    async def _sources(self, refs: set[tuple[str, str]]) -> dict[tuple[str, str], dict[str, str]]:
        """The keys of the Secrets and ConfigMaps the pod's env refers to, read from the apiserver as kubelet reads
        them: (kind, name) -> key -> value, a missing object left out."""
        namespace = self.pod["metadata"]["namespace"]
        out: dict[tuple[str, str], dict[str, str]] = {}
        for kind, name in sorted(refs):
            try:
                found = await self.node.client.request(
                    "GET", f"/api/v1/namespaces/{namespace}/{kind.lower()}s/{name}")
            except ApiError as e:
                if e.status == 404:
                    continue  # a reference to it fails with kubelet's message, unless optional
                raise Refused(f"cannot read {kind} {name}: HTTP {e.status}", retry=True) from None
            data: dict[str, str] = dict(found.get("data") or {})
            if kind == "Secret":
                data = {key: base64.b64decode(encoded).decode("utf-8", "replace") for key, encoded in data.items()}
            out[(kind, name)] = data
        return out

    async def _terminate(self) -> None:
        if self.shutdown:
            grace = min(self.node.shutdown_grace_s, *(c.grace_s() for c in self.containers)) \
                if self.containers else 0.0
            why = "pdfleet-sim stops"
            self._final = ("NodeShutdown", "pdfleet-sim stopped; the pod's processes were stopped with it "
                                           "(as on a node shutdown)")
        elif self.removed:
            grace, why = 0.0, "the pod object is gone"
        else:
            grace = float(self.pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            why = "the pod is being deleted"
        for c in self.containers:
            if c.proc is not None and not c.proc.exited.done():
                self.node.events.emit(self.pod, c.name, "Killing", f"Stopping container {c.name}")
        log.info("stopping pod", extra=self._fields(grace_s=grace, why=why))
        await asyncio.gather(*(c.stop(grace, why) for c in self.containers))

    async def _delete_object(self) -> None:
        meta = self.pod["metadata"]
        try:
            await self.node.client.delete_pod_now(meta["namespace"], meta["name"], self.uid)
            log.info("pod deleted", extra=self._fields())
        except ApiError as e:
            log.warning("pod delete failed", extra=self._fields(error=str(e)[:300]))

    def _cleanup(self) -> None:
        # Logs stay for post-mortems; the memory-backed emptyDir and the token do not outlive the pod. Once the
        # pod object is deleted, a new pod of the same name may already run in this directory: leave it alone.
        try:
            owner = (self.dir / OWNER).read_text()
        except OSError:
            owner = self.uid
        if owner != self.uid:
            return
        shutil.rmtree(self.dir / "shm", ignore_errors=True)
        (self.dir / "kubeconfig").unlink(missing_ok=True)

    # ------------------------------------------------------------------------------------------ status

    def _patch(self) -> Body:
        spec = self.pod["spec"]
        views = [c.view for c in self.containers]
        if self.refusal is not None:
            views = [status.ContainerView(c["name"], c.get("image", ""), status.waiting(CONFIG_ERROR, self.refusal))
                     for c in spec["containers"]]
        if self._final is not None:
            for v in views:
                if not v.is_terminated:
                    v.state = status.terminated(code=137, sig=None, started_at=time.time(), finished_at=time.time(),
                                                reason="ContainerStatusUnknown", message=self._final[1])
                v.ready = v.started = False
        phase = status.phase(str(spec.get("restartPolicy", "Always")), views)
        reason, message = ("", "")
        if self._final is not None:
            phase, (reason, message) = "Failed", self._final
        ready = bool(views) and all(v.ready for v in views) and not deleting(self.pod) and phase == "Running"
        if ready != self._ready:
            self._ready, self._ready_since = ready, time.time()
        inits = [status.ContainerView(c["name"], c.get("image", ""),
                                      status.terminated(code=0, sig=None, started_at=self._created,
                                                        finished_at=self._created,
                                                        message="emulated: the runtime is installed locally"))
                 for c in spec.get("initContainers") or []]
        for init in inits:
            init.ready = True
        return status.pod_patch(phase_now=phase, ready=ready, ready_since=self._ready_since, containers=views,
                                init_containers=inits, other_conditions=self.pod["status"].get("conditions") or [],
                                reason=reason, message=message)

    async def _writer(self) -> None:
        while True:
            await self.dirty.wait()
            self.dirty.clear()
            await self._write()

    async def _write(self) -> None:
        patch = self._patch()
        if patch == self._written or self.removed:
            return
        meta = self.pod["metadata"]
        try:
            await self.node.client.patch_pod_status(meta["namespace"], meta["name"], self.uid, patch)
            self._written = patch
            st = patch["status"]
            log.info("status written", extra=self._fields(
                phase=st["phase"], ready=st["conditions"][-1]["status"],
                containers={c["name"]: next(iter(k for k, v in c["state"].items() if v)) for c in
                            st["containerStatuses"]}))
        except ApiError as e:
            if e.status == 404 or isinstance(e, Replaced):
                self.gone()
                return
            log.warning("status write failed; retrying", extra=self._fields(error=str(e)[:300]))
            await asyncio.sleep(1)
            self.dirty.set()
        except Exception as e:
            log.warning("status write failed; retrying", extra=self._fields(error=str(e)[:300]))
            await asyncio.sleep(1)
            self.dirty.set()

    async def _flush(self) -> None:
        await self._write()



def pod_dir_of(cluster_dir: Path, namespace: str, name: str) -> Path:
    return cluster_dir / "pods" / namespace / name
