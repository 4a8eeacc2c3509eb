"""The runner starts no process for the pods of a namespace labelled pdfleet.dev/simulate=false: it turns them
Ready once kwok gave them an IP and deletes them at once when they are deleted. Other namespaces' pods get a
real worker."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from pdfleet.podrunner.node import Node
from pdfleet.podrunner.pod import PodWorker
from pdfleet.podrunner.runner import Runner
from pdfleet.podrunner.standin import StandIn, ready_patch, simulated

Body = dict[str, Any]
NODE = "pdfleet-gpu-0"


class FakeClient:
    def __init__(self, namespaces: dict[str, Body]) -> None:
        self.namespaces = namespaces
        self.gets: list[str] = []
        self.patches: list[tuple[str, str, Body]] = []
        self.deleted: list[tuple[str, str, str]] = []
        self.changed = asyncio.Event()

    async def request(self, method: str, path: str, **_: Any) -> Body:
        assert method == "GET"
        self.gets.append(path)
        await asyncio.sleep(0)  # the lookup is in flight while more pods arrive
        return self.namespaces[path.rsplit("/", 1)[1]]

    async def patch_pod_status(self, namespace: str, name: str, uid: str, patch: Body) -> Body:
        self.patches.append((namespace, name, patch))
        self.changed.set()
        return {}

    async def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append((namespace, name, uid))
        self.changed.set()


def namespace(name: str, **labels: str) -> Body:
    return {"metadata": {"name": name, "labels": labels}}


def pod(ns: str, name: str, *, ip: str | None = "127.1.0.5", deleting: bool = False) -> Body:
    meta: Body = {"namespace": ns, "name": name, "uid": f"uid-{ns}-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    st: Body = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    if ip:
        st["podIP"] = ip
    return {"metadata": meta, "spec": {"nodeName": NODE, "containers": [{"name": "engine", "image": "img"}],
                                       "initContainers": [{"name": "init", "image": "img"}]},
            "status": st}


def runner(client: FakeClient, tmp_path: Path) -> Runner:
    node = cast(Node, type("FakeNode", (), {"client": client, "pod_dir": lambda self, ns, n: tmp_path / ns / n})())
    r = Runner(node)
    r.nodes = {NODE}
    r.synced.set()
    return r


async def until(client: FakeClient, done: Any) -> None:
    async with asyncio.timeout(5):
        while not done():
            client.changed.clear()
            await client.changed.wait()


async def test_pods_of_an_unsimulated_namespace_turn_ready_and_go_without_a_process(tmp_path: Path) -> None:
    client = FakeClient({"bench": namespace("bench", **{"pdfleet.dev/simulate": "false"})})
    r = runner(client, tmp_path)
    r.on_upsert(pod("bench", "a"))
    r.on_upsert(pod("bench", "b"))
    await until(client, lambda: len(client.patches) == 2)

    assert client.gets == ["/api/v1/namespaces/bench"]  # one lookup for both pods
    assert all(isinstance(w, StandIn) for w in r.workers.values()) and len(r.workers) == 2
    status = client.patches[0][2]["status"]
    assert status["phase"] == "Running"
    assert {c["type"]: c["status"] for c in status["conditions"]} == \
        {"PodScheduled": "True", "Ready": "True", "ContainersReady": "True"}
    assert [c["ready"] for c in status["containerStatuses"]] == [True]
    assert "running" in status["containerStatuses"][0]["state"]

    r.on_upsert(pod("bench", "a", deleting=True))
    await until(client, lambda: client.deleted)
    assert client.deleted == [("bench", "a", "uid-bench-a")]
    for task in r.tasks.values():
        task.cancel()


async def test_a_stand_in_waits_for_kwok_to_give_the_pod_an_ip(tmp_path: Path) -> None:
    client = FakeClient({"bench": namespace("bench", **{"pdfleet.dev/simulate": "false"})})
    r = runner(client, tmp_path)
    r.on_upsert(pod("bench", "a", ip=None))
    async with asyncio.timeout(5):
        while not r.workers:
            await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert client.patches == []  # a patch before kwok's would keep kwok from giving the pod its IP
    r.on_upsert(pod("bench", "a"))
    await until(client, lambda: client.patches)
    for task in r.tasks.values():
        task.cancel()


async def test_pods_of_other_namespaces_get_a_worker_with_processes(tmp_path: Path) -> None:
    client = FakeClient({"demo": namespace("demo"), "other": namespace("other", **{"pdfleet.dev/simulate": "true"})})
    r = runner(client, tmp_path)
    r.on_upsert(pod("demo", "a", ip=None))
    r.on_upsert(pod("other", "b", ip=None))
    async with asyncio.timeout(5):
        while len(r.workers) < 2:
            await asyncio.sleep(0)
    assert all(isinstance(w, PodWorker) for w in r.workers.values())
    assert client.patches == [] and client.deleted == []
    tasks = list(r.tasks.values())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_only_false_turns_simulation_off() -> None:
    assert not simulated(namespace("x", **{"pdfleet.dev/simulate": "false"}))
    assert simulated(namespace("x", **{"pdfleet.dev/simulate": "true"}))
    assert simulated({"metadata": {"name": "x"}})


def test_the_ready_patch_marks_init_containers_done() -> None:
    inits = ready_patch(pod("ns", "a"), 0.0)["status"]["initContainerStatuses"]
    assert [(c["name"], c["state"]["terminated"]["exitCode"]) for c in inits] == [("init", 0)]
