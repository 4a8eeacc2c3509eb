"""operator/kopf_fixes.py against kopf's own code, only the API stream replaced.

1. kopf's watcher, worker and readiness toggles: a watch cancelled before its first listing ends, with an object
   whose first event was never processed (its namespace deleted while the operator starts), leaves the
   operator's indexing finished with the fix, and unfinished for good without it, which is what kopf 1.45 does.
2. kopf's namespace revision, orchestration and processing: a namespace kopf judges deleted (at the namespace
   controller's first status write, its objects still there) takes its pools out of the index and through the
   operator's DELETED handling with the fix; without it they stay indexed and no handler hears of them."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits import aiotasks, aiotoggles
from kopf._cogs.clients import watching
from kopf._cogs.structs import ephemera, references
from kopf._core.actions import lifecycles
from kopf._core.engines import indexing, peering
from kopf._core.intents import registries
from kopf._core.reactor import inventory, observation, orchestration, processing, queueing

from pdfleet.operator import kopf_fixes

PODS = references.Resource(group="", version="v1", plural="pods", namespaced=True)


async def _indexed_after_a_watch_ends_early(monkeypatch: pytest.MonkeyPatch) -> bool:
    first_event_in = asyncio.Event()

    async def stream(**_: Any) -> AsyncIterator[Any]:
        yield {"type": "ADDED", "object": {"metadata": {"uid": "u1", "name": "p", "namespace": "gone"}}}
        first_event_in.set()
        await asyncio.Event().wait()  # the listing never ends: the namespace goes first

    never = asyncio.Event()

    async def processor(**_: Any) -> None:
        await never.wait()  # the object's first event is still being processed when the watch is cancelled

    monkeypatch.setattr(queueing.watching, "infinite_watch", stream)
    indexed = aiotoggles.ToggleSet(all)
    resource_indexed = await indexed.make_toggle(name="pods@gone")
    settings = kopf.OperatorSettings()
    settings.watching.reconnect_backoff = 0
    settings.queueing.exit_timeout = 0.1
    task = asyncio.create_task(queueing.watcher(
        namespace="gone", settings=settings, resource=PODS, processor=processor,
        operator_indexed=indexed, resource_indexed=resource_indexed))
    await asyncio.wait_for(first_event_in.wait(), 5)
    await asyncio.sleep(0)  # the object's worker starts
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return indexed.is_on()


async def test_without_the_fix_kopf_never_finishes_indexing_after_a_watch_ended_early(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queueing, "watcher", getattr(queueing.watcher, "__wrapped__", queueing.watcher))
    monkeypatch.setattr(queueing, "worker", getattr(queueing.worker, "__wrapped__", queueing.worker))
    assert not await _indexed_after_a_watch_ends_early(monkeypatch)


async def test_with_the_fix_indexing_finishes_after_a_watch_ended_early(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queueing, "watcher", getattr(queueing.watcher, "__wrapped__", queueing.watcher))
    monkeypatch.setattr(queueing, "worker", getattr(queueing.worker, "__wrapped__", queueing.worker))
    kopf_fixes.install()
    kopf_fixes.install()  # idempotent: wrapped once
    assert getattr(queueing.watcher, "__wrapped__", None) is not None
    assert not hasattr(queueing.watcher.__wrapped__, "__wrapped__")
    assert await _indexed_after_a_watch_ends_early(monkeypatch)


# Fix 2: kopf's own namespace revision, orchestration, watcher, worker, processing and indexers; only the API stream
# is replaced, and the handlers are two of the operator's kind (an index and an event handler of pools).
POOLS = references.Resource(group="pdfleet.dev", version="v1alpha1", plural="inferencepools", namespaced=True)


def _pool(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "pdfleet.dev/v1alpha1", "kind": "InferencePool",
            "metadata": {"uid": f"uid-{namespace}", "name": "p", "namespace": namespace, "resourceVersion": "1"}}


class _Kopf:
    """kopf's orchestration of pool watches in the namespaces its insights hold, as `kopf.operator` wires it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        async def stream(*, namespace: str, **_: Any) -> AsyncIterator[Any]:
            yield {"type": "ADDED", "object": _pool(namespace)}
            yield watching.Bookmark.LISTED
            await asyncio.Event().wait()  # the watch stays open: no DELETED event comes through it

        monkeypatch.setattr(queueing.watching, "infinite_watch", stream)
        self.registry = registries.OperatorRegistry()
        self.events: list[tuple[str, str]] = []

        @kopf.index(POOLS.group, POOLS.version, POOLS.plural, registry=self.registry, id="pools")
        async def pools(body: kopf.Body, **_: Any) -> dict[tuple[str, str], str]:
            return {(body["metadata"]["namespace"], body["metadata"]["name"]): body["metadata"]["uid"]}

        @kopf.on.event(POOLS.group, POOLS.version, POOLS.plural, registry=self.registry)
        async def pool_event(event: kopf.RawEvent, **_: Any) -> None:
            self.events.append((str(event["type"]), event["object"]["metadata"]["namespace"]))

        self.settings = kopf.OperatorSettings()
        self.settings.peering.standalone = True
        self.settings.queueing.exit_timeout = 1
        self.insights = references.Insights()
        self.insights.watched_resources.add(POOLS)
        self.insights.indexed_resources.add(POOLS)
        self.indexers = indexing.OperatorIndexers()
        self.indexers.ensure(self.registry._indexing.get_all_handlers())

    async def start(self, namespaces: set[str]) -> None:
        paused = aiotoggles.ToggleSet(any)
        self.ensemble = orchestration.Ensemble(operator_indexed=aiotoggles.ToggleSet(all), operator_paused=paused,
                                               peering_missing=await paused.make_toggle(name="peering"))
        self.processor = functools.partial(
            processing.process_resource_event, lifecycle=lifecycles.all_at_once, registry=self.registry,
            settings=self.settings, indexers=self.indexers, memories=inventory.ResourceMemories(),
            memobase=ephemera.Memo(), operator_paused=paused, event_queue=asyncio.Queue())
        self.insights.namespaces.update(namespaces)
        await self.adjust()
        await asyncio.wait_for(self.ensemble.operator_indexed.wait_for(True), 5)
        for namespace in namespaces:
            await self.listed(namespace)

    async def adjust(self) -> None:
        await orchestration.adjust_tasks(processor=self.processor, insights=self.insights, settings=self.settings,
                                         identity=peering.Identity("test"), ensemble=self.ensemble)

    async def listed(self, namespace: str) -> None:
        async def settled() -> None:
            while (namespace, "p") not in self.indexers.indices["pools"]:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(settled(), 5)

    async def namespace_deleted(self, namespace: str) -> None:
        """What kopf's namespace observer does when the namespace controller first writes a deleting namespace's
        status (its conditions say nothing remains to be removed yet), then the orchestrator's next turn."""
        deleting = {"type": "MODIFIED", "object": {
            "metadata": {"name": namespace, "deletionTimestamp": "2026-12-06T07:02:16Z"},
            "status": {"phase": "Terminating", "conditions": [
                {"type": "NamespaceDeletionContentFailure", "status": "False"}]}}}
        observation.revise_namespaces(insights=self.insights, namespaces=["team-*"], raw_events=[deleting])
        assert namespace not in self.insights.namespaces  # kopf stops watching it now
        await self.adjust()  # it ends once the namespace's watch has ended (kopf's aiotasks.stop waits for it)

    async def stop(self) -> None:
        await aiotasks.stop(self.ensemble.get_tasks(self.ensemble.get_keys()), title="streaming", quiet=True)


def _unfixed(monkeypatch: pytest.MonkeyPatch) -> None:
    for module, name in ((queueing, "watcher"), (queueing, "worker"), (orchestration, "terminate_redundancies")):
        run = getattr(module, name)
        monkeypatch.setattr(module, name, getattr(run, "__wrapped__", run))


async def test_without_the_fix_a_deleted_namespaces_pool_stays_in_kopfs_index_and_no_handler_hears_of_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _unfixed(monkeypatch)
    world = _Kopf(monkeypatch)
    await world.start({"team-a", "team-b"})
    await world.namespace_deleted("team-a")
    assert ("team-a", "p") in world.indexers.indices["pools"]
    assert ("DELETED", "team-a") not in world.events
    await world.stop()


async def test_with_the_fix_a_deleted_namespaces_pool_leaves_the_index_and_its_handler_hears_deleted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _unfixed(monkeypatch)
    kopf_fixes.install()
    world = _Kopf(monkeypatch)
    await world.start({"team-a", "team-b"})
    await world.namespace_deleted("team-a")
    assert ("team-a", "p") not in world.indexers.indices["pools"]
    assert world.events.count(("DELETED", "team-a")) == 1
    # The other namespace's watch goes on, and the operator stopping forgets nothing: only a namespace gone does.
    assert ("team-b", "p") in world.indexers.indices["pools"]
    await world.stop()
    assert ("team-b", "p") in world.indexers.indices["pools"]
    assert ("DELETED", "team-b") not in world.events
