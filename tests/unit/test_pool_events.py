"""The pool's watch handler: news is reconciled now (a new spec before other work), the echo of the operator's own
status write is coalesced with the events of the objects its reconcile wrote."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pdfleet.operator import handlers
from pdfleet.operator.api import meta as api_meta
from pdfleet.operator.controller import Controller
from pdfleet.operator.runtime_state import OperatorState, Options
from tests.support.fake_kube import FakeKube
from tests.support.pools import pool_body

KEY = ("ns", "tiny")


def event(kube: FakeKube, type_: str = "MODIFIED") -> dict[str, Any]:
    body = kube.get("InferencePool", *KEY)
    assert body is not None
    return {"type": type_, "object": body}


async def test_an_echo_of_our_status_write_waits_to_be_coalesced_and_news_does_not() -> None:
    kube = FakeKube()
    kube.seed(pool_body())
    state = OperatorState(options=Options(owned_event_delay=0.05))
    state.controller = Controller(client=kube, cache=kube.cache())
    memo: dict[str, Any] = {"state": state}

    await handlers.pool_event(event(kube, "ADDED"), memo)  # a new spec: urgent, now
    assert len(state.queue) == 1
    key = await state.queue._next()
    await state.controller.reconcile(key)
    state.queue._done(key, failed=False)
    assert len(state.queue) == 0

    await handlers.pool_event(event(kube), memo)  # the echo of the status write just made
    assert len(state.queue) == 0, "an echo is not reconciled at once"
    await asyncio.wait_for(_until(lambda: len(state.queue) == 1), timeout=5)

    key = await state.queue._next()
    state.queue._done(key, failed=False)
    kube.update("InferencePool", *KEY, lambda o: o["metadata"].setdefault("labels", {}).update(team="a"))
    await handlers.pool_event(event(kube), memo)  # someone else's write: news
    assert len(state.queue) == 1
    state.queue.close()


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(("type_", "pod", "polls"), [
    ("ADDED", {"metadata": {"name": "p"}, "status": {"phase": "Pending"}}, False),  # no address: no agent to ask
    ("MODIFIED", {"metadata": {"name": "p"}, "spec": {"nodeName": "n"}, "status": {"phase": "Pending"}}, False),
    ("MODIFIED", {"metadata": {"name": "p"}, "status": {"phase": "Running", "podIP": "127.1.0.2"}}, True),
    ("MODIFIED", {"metadata": {"name": "p", "deletionTimestamp": "2026-12-03T12:00:00Z"}, "status": {}}, True),
    ("DELETED", {"metadata": {"name": "p"}, "status": {}}, True),
])
def test_only_pod_events_that_can_change_a_verdict_poll_the_agents_at_once(type_: str, pod: dict[str, Any],
                                                                          polls: bool) -> None:
    assert handlers._pod_news_for_health({"type": type_, "object": pod}) is polls


def _pod_event_handler() -> Any:
    """The pods' watch handler, as kopf runs it (registered in a loop over the owned kinds, so found by id)."""
    import kopf
    [handler] = [h for h in kopf.get_default_registry()._watching.get_all_handlers() if h.id == "pods_event"]
    return handler.fn


def _gang_pod(*, gated: bool, deleting: bool, phase: str = "Pending") -> dict[str, Any]:
    owner = {"apiVersion": f"{api_meta.GROUP}/{api_meta.VERSION}", "kind": api_meta.KIND, "name": "gone",
             "uid": "u", "controller": True}
    meta: dict[str, Any] = {"name": "gone-decode-0-0", "namespace": "ns", "ownerReferences": [owner],
                            "finalizers": ["kueue.x-k8s.io/managed"]}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T01:00:00Z"
    spec = {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]} if gated else {"nodeName": "n"}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


@pytest.mark.parametrize(("gated", "deleting", "phase", "queued"), [
    (True, True, "Pending", True),  # deleted before Kueue admitted it: its finalizer keeps it Terminating
    (False, True, "Succeeded", True),  # deleted, its containers ended (its Workload deleted beside it)
    (False, True, "Running", False),  # admitted and running: Kueue takes its finalizer off once it stops
    (True, False, "Pending", False),  # still waiting, not deleted: nothing to release
])
async def test_a_deleted_pool_s_pod_kueue_would_keep_is_still_reconciled(gated: bool, deleting: bool, phase: str,
                                                                         queued: bool) -> None:
    """A pool no longer reconciled (deleted, forgotten) gets a reconcile for its pod that Kueue's finalizer keeps
    Terminating: that reconcile releases it (the pool's absence is checked after). Its other pods' events queue
    nothing."""
    state = OperatorState(options=Options(owned_event_delay=0.01))
    pod = _gang_pod(gated=gated, deleting=deleting, phase=phase)
    await _pod_event_handler()({"type": "MODIFIED", "object": pod}, {"state": state})
    await asyncio.sleep(0.05)
    assert len(state.queue) == int(queued)
    state.queue.close()


async def test_a_detached_reconcile_hands_back_its_writes_once_the_plan_is_made() -> None:
    """The worker's entry point: a new pool's reconcile returns as soon as its plan is made, with its writes still
    to finish (the API answers nothing until let go here); awaiting what it handed back finishes them. A pool with
    nothing to write hands back nothing."""
    kube = FakeKube()
    kube.seed(pool_body())
    controller = Controller(client=kube, cache=kube.cache())
    answer = asyncio.Event()
    request = kube.request

    async def slow(*args: Any, **kwargs: Any) -> Any:
        await answer.wait()
        return await request(*args, **kwargs)

    kube.request = slow  # type: ignore[method-assign]
    rest = await asyncio.wait_for(controller.reconcile_detaching(KEY), timeout=5)
    assert rest is not None and not kube.of_kind("Pod"), "planned, nothing written yet"
    answer.set()
    await asyncio.wait_for(rest, timeout=5)
    assert kube.of_kind("Pod"), "the writes it handed back are done"
    assert await controller.reconcile_detaching(KEY) is None, "a settled pool has nothing to hand back"
