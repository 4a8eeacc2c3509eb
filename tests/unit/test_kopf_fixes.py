"""operator/kopf_fixes.py against kopf's own watcher, worker and readiness toggles (only the API stream is
replaced): a watch cancelled before its first listing ends, with an object whose first event was never
processed (its namespace deleted while the operator starts), leaves the operator's indexing finished with the
fix, and unfinished for good without it, which is what kopf 1.45 does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.structs import references
from kopf._core.reactor import queueing

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
