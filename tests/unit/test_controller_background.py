"""The executor's concurrency helpers: the write slots that let some writes ahead, and Events posted after a
reconcile instead of during it (what the operator runs with)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pdfleet.operator.controller import Controller
from pdfleet.operator.kube.detached import Detached
from pdfleet.operator.kube.slots import Slots
from tests.support.fake_kube import FakeKube
from tests.support.pools import pool_body

KEY = ("ns", "tiny")


async def test_waiters_get_slots_by_rank_then_in_the_order_they_came() -> None:
    slots = Slots(1, ranks=3)
    order: list[str] = []
    release = asyncio.Event()

    async def hold(name: str, rank: int | None = None) -> None:
        async with slots.held(rank=rank):
            order.append(name)
            if name == "holder":
                await release.wait()

    holder = asyncio.create_task(hold("holder"))
    await asyncio.sleep(0)
    queued = [asyncio.create_task(hold(f"service-{i}")) for i in range(2)]
    await asyncio.sleep(0)
    pods = [asyncio.create_task(hold(f"pod-{i}", 1)) for i in range(2)]
    await asyncio.sleep(0)
    policy = asyncio.create_task(hold("policy", 0))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(holder, *queued, *pods, policy)

    assert order == ["holder", "policy", "pod-0", "pod-1", "service-0", "service-1"]


async def test_a_cancelled_waiter_gives_its_slot_on() -> None:
    slots = Slots(1)
    release = asyncio.Event()

    async def hold() -> None:
        async with slots.held():
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(hold())
    after = asyncio.create_task(hold())
    await asyncio.sleep(0)
    cancelled.cancel()
    release.set()
    await asyncio.wait_for(asyncio.gather(holder, after), 1)
    assert cancelled.cancelled()
    async with slots.held():  # nothing leaked: the one slot is free again
        pass


async def test_detached_work_runs_bounded_and_a_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    detached = Detached(2)
    running = peak = 0
    gate = asyncio.Event()

    async def work() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await gate.wait()
        running -= 1

    async def broken() -> None:
        raise RuntimeError("lost")

    for _ in range(5):
        detached.spawn(work())
    detached.spawn(broken())
    await asyncio.sleep(0.01)
    assert peak == 2 and len(detached) == 6
    gate.set()
    with caplog.at_level(logging.ERROR):
        await detached.drain(timeout=1)
    assert len(detached) == 0 and peak == 2
    assert "background work failed" in caplog.text


async def test_in_the_background_a_new_pools_events_follow_its_status_and_drain_waits_for_them() -> None:
    kube = FakeKube()
    kube.seed(pool_body())
    controller = Controller(client=kube, cache=kube.cache(), background_events=True)

    await controller.reconcile(KEY)
    assert [w.verb for w in kube.take_writes()][-1] == "status", "the reconcile did not wait for its events"

    await controller.drain(timeout=1)
    writes = kube.take_writes()
    assert [w.verb for w in writes] == ["create", "create"]
    assert sorted(e["reason"] for e in kube.of_kind("Event", "ns")) == ["GroupCreated", "GroupCreated"]
