"""What bench_operator.py's scenarios share: a settled cluster to start from, the clock that times each pool
from its creation to all its engine pods existing, and the floor writer.

The floor is what no operator can beat: the very objects the operator would write for a pool (rendered before
the clock starts by the operator's own planner, so they are identical), created by a client with no logic
(one POST each, as many pools at once as the operator has workers, as many requests in flight as it allows),
plus one status write per pool. It does not watch the pool: the code that creates the pool hands it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client as k8s

from pdfleet.operator.cache import Observed
from pdfleet.operator.controller import MAX_IN_FLIGHT
from pdfleet.operator.kube import api_paths
from pdfleet.operator.kube.kube_client import KubeClient
from pdfleet.operator.planning import reconcile
from pdfleet.podrunner.standin import SIMULATE_LABEL
from pdfleet.podrunner.status import CONTAINER_ID_PREFIX

ROOT = Path(__file__).resolve().parents[1]
Body = dict[str, Any]
GROUPS_PER_ROLE = 4  # 8 engine groups (of one pod each) per pool
PODS_PER_POOL = 2 * GROUPS_PER_ROLE
WORKERS = 8  # the operator's --workers in this benchmark; the floor creates as many pools at once
BENCH_LABEL = "pdfleet.dev/bench"
POOLS_PATH = "/apis/pdfleet.dev/v1alpha1/namespaces/{namespace}/inferencepools"


def pool_body(namespace: str, name: str) -> Body:
    body = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
    body["metadata"] = {"name": name, "namespace": namespace}
    body["spec"]["prefill"]["replicas"] = GROUPS_PER_ROLE
    body["spec"]["decode"]["replicas"] = GROUPS_PER_ROLE
    return body


def namespace_body(name: str) -> Body:
    """A namespace whose pods pdfleet-sim plays without processes (podrunner/standin.py): 800 simulated
    engines would measure the machine, not the operator."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {SIMULATE_LABEL: "false", BENCH_LABEL: "operator"}}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# ------------------------------------------------------------------------------------------- settling


async def count(api: KubeClient, path: str, **query: str) -> int:
    """How many objects a list would return, from one item and the server's remainingItemCount."""
    listing = await api.request("GET", path, query={**query, "limit": "1"})
    return len(listing["items"]) + int(listing["metadata"].get("remainingItemCount") or 0)


async def cluster_counts(api: KubeClient) -> dict[str, int]:
    namespaces = (await api.request("GET", "/api/v1/namespaces"))["items"]
    return {
        "pods": await count(api, "/api/v1/pods"),
        "services": await count(api, "/api/v1/services"),
        "configmaps": await count(api, "/api/v1/configmaps"),
        "inferencepools": await count(api, "/apis/pdfleet.dev/v1alpha1/inferencepools"),
        "namespaces terminating": sum(n["status"].get("phase") == "Terminating" for n in namespaces),
    }


async def settle(api: KubeClient, *, timeout: float = 900, then: str = "cluster at start") -> dict[str, int]:
    """Waits until no benchmark namespace and no terminating namespace is left (their pods go first), saying
    what it waits for every 10 s; returns the cluster's object counts then."""
    deadline = time.monotonic() + timeout
    said = 0.0
    while True:
        namespaces = (await api.request("GET", "/api/v1/namespaces"))["items"]
        left = [n["metadata"]["name"] for n in namespaces
                if n["status"].get("phase") == "Terminating" or BENCH_LABEL in (n["metadata"].get("labels") or {})]
        if not left:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"the cluster did not settle in {timeout:.0f} s: namespaces {', '.join(left)} remain")
        if time.monotonic() - said >= 10:
            said = time.monotonic()
            pods = {ns: await count(api, f"/api/v1/namespaces/{ns}/pods") for ns in left}
            print("   settling: waiting for " + ", ".join(f"{ns} ({p} pods left)" for ns, p in pods.items()),
                  flush=True)
        await asyncio.sleep(1)
    counts = await cluster_counts(api)
    print(f"   {then}: " + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
    return counts


async def delete_namespace(api: KubeClient, name: str) -> None:
    with contextlib.suppress(Exception):
        await api.request("DELETE", f"/api/v1/namespaces/{name}", body={"propagationPolicy": "Background"})


# ------------------------------------------------------------------------------------------- the clock


class PodClock:
    """Seconds from each pool's creation to all of its engine pods existing, from one watch of the
    namespace's pods. Refuses pods that pdfleet-sim ran as processes: then it predates the simulate label."""

    def __init__(self, raw: k8s.ApiClient, namespace: str, names: list[str]) -> None:
        self._raw = raw
        self._namespace = namespace
        self.started: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self._seen: dict[str, set[str]] = {n: set() for n in names}
        self._all = asyncio.Event()
        self._ready = asyncio.Event()
        self.played: str | None = None

    def start(self, name: str) -> None:
        self.started[name] = time.perf_counter()

    async def _get(self, query: list[tuple[str, str]], timeout: float) -> Any:
        return await self._raw.call_api(f"/api/v1/namespaces/{self._namespace}/pods", "GET", query_params=query,
                                        auth_settings=["BearerToken"], _preload_content=False,
                                        _request_timeout=timeout)

    async def _events(self) -> AsyncIterator[Body]:
        """Every pod as ADDED/MODIFIED events. A busy apiserver closes a watch that falls behind (a burst of 800
        pods on 2 cores does): then list what exists and watch again from there, so no pod is missed."""
        selector = ("labelSelector", "pdfleet.dev/pool,app.kubernetes.io/component!=router")
        version = None
        while True:
            if version is None:
                async with await self._get([selector], 60) as listed:
                    body = json.loads(await listed.read())
                version = body["metadata"]["resourceVersion"]
                for pod in body.get("items") or []:
                    yield {"type": "ADDED", "object": pod}
            query = [("watch", "1"), selector, ("timeoutSeconds", "900"), ("resourceVersion", version),
                     ("allowWatchBookmarks", "true")]
            async with await self._get(query, 960) as response:
                self._ready.set()
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":  # e.g. 410: the version is too old to watch from
                        version = None
                        break
                    version = event["object"]["metadata"].get("resourceVersion", version)
                    if event.get("type") != "BOOKMARK":
                        yield event

    async def _watch(self) -> None:
        async with contextlib.aclosing(self._events()) as events:
            async for event in events:
                pod = event["object"]
                if any(str(c.get("containerID", "")).startswith(CONTAINER_ID_PREFIX)
                       for c in (pod.get("status") or {}).get("containerStatuses") or []):
                    self.played = pod["metadata"]["name"]
                    break
                pool = pod["metadata"]["labels"].get("pdfleet.dev/pool", "")
                if pool in self.started and pool not in self.done:
                    self._seen[pool].add(pod["metadata"]["name"])
                    if len(self._seen[pool]) == PODS_PER_POOL:
                        self.done[pool] = time.perf_counter() - self.started[pool]
                        if len(self.done) == len(self._seen):
                            break
        self._all.set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[PodClock]:
        task = asyncio.create_task(self._watch())
        try:
            await asyncio.wait([task, asyncio.ensure_future(self._ready.wait())], return_when="FIRST_COMPLETED")
            yield self
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def wait(self, timeout: float = 900) -> dict[str, float]:
        await asyncio.wait_for(self._all.wait(), timeout)
        if self.played:
            raise SystemExit(f"pdfleet-sim runs pod {self.played} as processes although its namespace is labelled "
                             f"{SIMULATE_LABEL}=false: it predates that label; restart it "
                             "(make cluster-down cluster-up) and run the benchmark again")
        if len(self.done) < len(self._seen):
            raise SystemExit(f"the pod watch ended with {len(self.done)} of {len(self._seen)} pools complete")
        return self.done


async def create_pools(api: KubeClient, clock: PodClock, namespace: str, names: list[str], rate: float,
                       handover: Callable[[Body], None] = lambda _: None) -> None:
    """Creates the pools back to back (rate 0) or `rate` per second, starting each one's clock just before."""
    t0 = time.perf_counter()
    for i, name in enumerate(names):
        if rate > 0:
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
        clock.start(name)
        handover(await api.request("POST", POOLS_PATH.format(namespace=namespace), body=pool_body(namespace, name)))


# ------------------------------------------------------------------------------------------- the floor


def rendered(namespace: str, name: str) -> tuple[list[Body], Body]:
    """What the operator's planner writes for a new pool: its objects and its status. The pool's uid is not
    known before it is created; `Floor` puts it into the owner references."""
    pool = pool_body(namespace, name)
    pool["metadata"] |= {"uid": "uid-to-come", "generation": 1, "resourceVersion": "1"}
    plan = reconcile.plan(pool, Observed(pool=pool, owned={}), now=datetime.datetime.now(datetime.UTC))
    assert plan.status is not None and not plan.delete and not plan.capture
    return [copy.deepcopy(o) for o in plan.apply], dict(plan.status)


class Floor:
    """Writes each handed-over pool's pre-rendered objects: `WORKERS` pools at a time, `MAX_IN_FLIGHT`
    requests at a time, then the pool's status."""

    def __init__(self, api: KubeClient, rendered: Mapping[str, tuple[list[Body], Body]]) -> None:
        self._api = api
        self._rendered = rendered
        self._queue: asyncio.Queue[Body] = asyncio.Queue()
        self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.writes = 0

    def handover(self, pool: Body) -> None:
        self._queue.put_nowait(pool)

    async def _create(self, obj: Body) -> None:
        async with self._in_flight:
            await self._api.create(obj)
        self.writes += 1

    async def _worker(self, pools: int) -> None:
        while self._handled < pools:
            self._handled += 1
            pool = await self._queue.get()
            meta = pool["metadata"]
            objects, status = self._rendered[meta["name"]]
            for obj in objects:
                obj["metadata"]["ownerReferences"][0]["uid"] = meta["uid"]
            await asyncio.gather(*(self._create(o) for o in objects))
            async with self._in_flight:
                await self._api.request("PATCH", api_paths.object_path(pool) + "/status", body={"status": status},
                                        content_type="application/merge-patch+json")
            self.writes += 1

    async def run(self, pools: int) -> None:
        self._handled = 0
        await asyncio.gather(*(self._worker(pools) for _ in range(WORKERS)))
