"""A pod can reach the runner before the runner knows its node (the runner starts before the local cluster's
nodes are created). It must then be taken on in its latest version once the nodes are listed again: an older
version never overwrites a newer one, and none is dropped (the CI once lost a decode pod's IP this way: the
pod waited three minutes for an IP it already had)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from pdfleet.podrunner.node import Node
from pdfleet.podrunner.runner import Runner
from pdfleet.podrunner.standin import StandIn

Body = dict[str, Any]
NODE = "pdfleet-gpu-2"
REAL_NODE = "pdfleet-real-0"  # a real kubelet's node: its pods are not the runner's


class Cluster:
    """The two reads the runner makes here: the nodes (slow to answer, and not there at first) and the pods'
    namespace (unsimulated, so the runner's workers are stand-ins that write a Ready status)."""

    def __init__(self) -> None:
        self.nodes: list[str] = []
        self.listings = 0
        self.listing = asyncio.Event()  # set while a node listing is in flight
        self.answer = asyncio.Event()  # the test lets the in-flight listing answer
        self.patches: list[Body] = []
        self.changed = asyncio.Event()

    async def list(self, path: str, params: Any) -> Body:
        assert path == "/api/v1/nodes"
        self.listings += 1
        nodes = list(self.nodes)  # what the apiserver holds when the request arrives
        self.listing.set()
        await self.answer.wait()
        self.answer.clear()
        self.listing.clear()
        return {"items": [{"metadata": {"name": n, "labels": {"pdfleet.dev/local-cluster": "true"}}} for n in nodes]
                + [{"metadata": {"name": REAL_NODE, "labels": {"pdfleet.dev/real-node": "true"}}}]}

    async def request(self, method: str, path: str, **_: Any) -> Body:
        return {"metadata": {"name": path.rsplit("/", 1)[1], "labels": {"pdfleet.dev/simulate": "false"}}}

    async def patch_pod_status(self, namespace: str, name: str, uid: str, patch: Body) -> Body:
        self.patches.append(patch)
        self.changed.set()
        return {}


def pod(*, ip: str | None) -> Body:
    st: Body = {"phase": "Pending", "conditions": []}
    if ip:
        st["podIP"] = ip
    return {"metadata": {"namespace": "bench", "name": "a", "uid": "uid-a"},
            "spec": {"nodeName": NODE, "containers": [{"name": "engine", "image": "img"}]}, "status": st}


def runner(cluster: Cluster, tmp_path: Path) -> Runner:
    node = cast(Node, type("FakeNode", (), {"client": cluster, "pod_dir": lambda self, ns, n: tmp_path / n})())
    r = Runner(node)  # knows no node yet
    r.synced.set()
    cluster.nodes = [NODE]  # the node exists by the time the runner lists the nodes again
    return r


async def test_a_pod_seen_before_its_node_is_taken_on_in_its_latest_version(tmp_path: Path) -> None:
    cluster = Cluster()
    r = runner(cluster, tmp_path)

    r.on_upsert(pod(ip=None))  # bound, no IP yet: the runner lists the nodes
    async with asyncio.timeout(5):
        await cluster.listing.wait()
    r.on_upsert(pod(ip="127.1.2.1"))  # kwok gives the IP while that listing is in flight
    cluster.answer.set()
    async with asyncio.timeout(5):
        while not cluster.patches:
            cluster.changed.clear()
            await cluster.changed.wait()

    worker = r.workers["uid-a"]
    assert isinstance(worker, StandIn)
    assert worker.pod["status"].get("podIP") == "127.1.2.1"  # not the older body the listing was started for
    assert cluster.patches[0]["status"]["conditions"][-1]["status"] == "True"
    assert cluster.listings == 1  # the second version needed no listing of its own
    for task in r.tasks.values():
        task.cancel()
    await asyncio.gather(*r.tasks.values(), return_exceptions=True)


async def test_a_pod_deleted_while_its_node_is_looked_up_is_never_taken_on(tmp_path: Path) -> None:
    cluster = Cluster()
    r = runner(cluster, tmp_path)
    r.on_upsert(pod(ip=None))
    async with asyncio.timeout(5):
        await cluster.listing.wait()
    r.on_delete(pod(ip=None))
    cluster.answer.set()
    async with asyncio.timeout(5):
        while r._placing is not None and not r._placing.done():
            await asyncio.sleep(0.01)
    assert r.workers == {}


async def test_a_pod_on_a_real_kubelet_s_node_is_neither_run_nor_kept_waiting(tmp_path: Path) -> None:
    cluster = Cluster()
    r = runner(cluster, tmp_path)
    r.on_upsert(pod(ip=None))  # one of ours, unknown yet: the runner lists the nodes
    async with asyncio.timeout(5):
        await cluster.listing.wait()
    cluster.answer.set()
    async with asyncio.timeout(5):
        while r._placing is not None and not r._placing.done():
            await asyncio.sleep(0.01)
    real = pod(ip="10.244.0.5")
    real["metadata"] |= {"name": "b", "uid": "uid-b"}
    real["spec"]["nodeName"] = REAL_NODE
    r.on_upsert(real)
    assert "uid-b" not in r.workers and "uid-b" not in r._unplaced
    assert r._placing.done() and cluster.listings == 1  # no listing started for it
    for task in r.tasks.values():
        task.cancel()
    await asyncio.gather(*r.tasks.values(), return_exceptions=True)
