"""The work queue coalesces pokes, never runs a key twice at once, and retries failures with backoff."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from pdfleet.operator.workqueue import WorkQueue


async def drain(queue: WorkQueue[str], handled: list[str], *, fail: set[str] | None = None) -> asyncio.Task[None]:
    async def handle(key: str) -> None:
        handled.append(key)
        if fail and key in fail:
            fail.discard(key)
            raise RuntimeError("boom")

    return asyncio.create_task(queue.run_worker(handle))


async def wait_idle(queue: WorkQueue[str]) -> None:
    while not queue.idle:
        await asyncio.sleep(0)


async def test_many_pokes_of_a_waiting_key_are_handled_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    handled: list[str] = []
    worker = await drain(queue, handled)
    await wait_idle(queue)
    worker.cancel()
    assert handled == ["a", "b"]


async def test_a_key_poked_while_being_handled_is_handled_again_afterwards() -> None:
    queue: WorkQueue[str] = WorkQueue()
    entered, release = asyncio.Event(), asyncio.Event()
    handled: list[str] = []
    running = 0
    max_running = 0

    async def handle(key: str) -> None:
        nonlocal running, max_running
        running += 1
        max_running = max(max_running, running)
        handled.append(key)
        entered.set()
        await release.wait()
        running -= 1

    workers = [asyncio.create_task(queue.run_worker(handle)) for _ in range(2)]
    queue.add("a")
    await entered.wait()
    queue.add("a")  # arrives mid-handling: must not start a second concurrent handler
    for _ in range(10):
        await asyncio.sleep(0)
    assert max_running == 1
    release.set()
    await wait_idle(queue)
    for w in workers:
        w.cancel()
    assert handled == ["a", "a"]
    assert max_running == 1


async def test_a_failed_key_is_retried_after_a_backoff() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01)
    handled: list[str] = []
    worker = await drain(queue, handled, fail={"a"})
    queue.add("a")
    for _ in range(500):
        if handled == ["a", "a"]:
            break
        await asyncio.sleep(0.01)
    worker.cancel()
    assert handled == ["a", "a"]


@pytest.mark.parametrize(("failures", "expected"), [(1, 0.5), (2, 1.0), (3, 2.0), (20, 60.0)])
async def test_backoff_doubles_up_to_a_ceiling(failures: int, expected: float) -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.5, max_delay=60)
    delays: list[float] = []
    queue.add_after = lambda key, delay: delays.append(delay)  # type: ignore[method-assign]
    for _ in range(failures):
        queue._active.add("k")
        queue._done("k", failed=True)
    assert delays[-1] == expected


async def test_forget_cancels_a_pending_retry() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.05)
    queue._active.add("gone")
    queue._done("gone", failed=True)
    queue.forget("gone")
    await asyncio.sleep(0.1)
    assert len(queue) == 0


async def _handled_within(queue: WorkQueue[str], handled: list[str], key: str, seconds: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        if key in handled:
            return True
        await asyncio.sleep(0.005)
    return key in handled


async def test_a_shorter_delay_overrides_a_pending_longer_backoff() -> None:
    # A failure backoff of 30 s is pending when an owned object's event asks for the key in 10 ms: the key is
    # handled after the short delay, not the long one (client-go keeps the earliest deadline).
    queue: WorkQueue[str] = WorkQueue(base_delay=30, max_delay=60)
    handled: list[str] = []
    worker = await drain(queue, handled, fail={"a"})
    queue.add("a")
    assert await _handled_within(queue, handled, "a", 1.0)
    handled.clear()  # the first run failed: a retry is pending 30 s out
    queue.add_after("a", 0.01)
    await _handled_once(queue, worker, handled)


async def _handled_once(queue: WorkQueue[str], worker: asyncio.Task[None], handled: list[str]) -> None:
    try:
        assert await _handled_within(queue, handled, "a", 2.0)
    finally:
        worker.cancel()
        queue.close()
    assert handled == ["a"]


async def test_a_longer_delay_does_not_postpone_a_pending_shorter_one() -> None:
    queue: WorkQueue[str] = WorkQueue()
    handled: list[str] = []
    worker = await drain(queue, handled)
    queue.add_after("a", 0.01)
    queue.add_after("a", 30)
    await _handled_once(queue, worker, handled)


async def test_a_key_waiting_twice_is_handled_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    handled: list[str] = []
    worker = await drain(queue, handled)
    queue.add_after("a", 0.05)
    queue.add_after("a", 0.01)  # replaces the first timer instead of adding a second one
    try:
        assert await _handled_within(queue, handled, "a", 2.0)
        await asyncio.sleep(0.1)  # past the first deadline: a leftover timer would have fired by now
        await wait_idle(queue)
    finally:
        worker.cancel()
        queue.close()
    assert handled == ["a"]


async def test_urgent_keys_are_handled_before_the_others_and_a_waiting_key_can_be_promoted() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for key in ("owned-1", "owned-2", "owned-3"):
        queue.add(key)
    queue.add("new-pool", urgent=True)
    queue.add("owned-3", urgent=True)  # its pool's spec changed while it waited
    assert len(queue) == 4
    handled: list[str] = []
    worker = await drain(queue, handled)
    await wait_idle(queue)
    worker.cancel()
    assert handled == ["new-pool", "owned-3", "owned-1", "owned-2"]


async def test_an_urgent_poke_while_a_key_is_handled_brings_it_back_ahead_of_the_others() -> None:
    queue: WorkQueue[str] = WorkQueue()
    handled: list[str] = []
    release = asyncio.Event()

    async def handle(key: str) -> None:
        handled.append(key)
        if key == "a" and handled.count("a") == 1:
            queue.add("b")
            queue.add("a", urgent=True)  # poked while active: handled again, before b
            await release.wait()

    worker = asyncio.create_task(queue.run_worker(handle))
    queue.add("a")
    while len(handled) < 1:
        await asyncio.sleep(0)
    release.set()
    await wait_idle(queue)
    worker.cancel()
    assert handled == ["a", "a", "b"]


async def test_a_detaching_worker_takes_the_next_key_while_a_rest_runs_and_never_runs_a_key_twice_at_once() -> None:
    """One worker, a handler that hands back the rest of its work: the next key is handled while the first key's
    rest still runs; a poke of that key meanwhile waits for its rest, then the key is handled once more; a rest
    that fails is retried with backoff; at most `detached_limit` rests run at once."""
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01, detached_limit=2)
    release: dict[str, asyncio.Event] = {}
    log: list[str] = []
    failing = {"c"}

    async def rest(key: str) -> None:
        log.append(f"rest {key} starts")
        await release.setdefault(key, asyncio.Event()).wait()
        log.append(f"rest {key} ends")
        if key in failing:
            failing.discard(key)
            raise RuntimeError("the writes failed")

    async def handle(key: str) -> asyncio.Task[None]:
        log.append(f"plan {key}")
        release[key] = asyncio.Event()
        return asyncio.ensure_future(rest(key))

    worker = asyncio.create_task(queue.run_detaching_worker(handle))
    queue.add("a")
    queue.add("b")
    await _until(lambda: "rest b starts" in log)
    assert sorted(log) == ["plan a", "plan b", "rest a starts", "rest b starts"], "b planned while a's rest runs"
    queue.add("a")  # poked while its rest runs: not handled again yet
    queue.add("c")  # the limit (2 rests) is reached: c waits for a room
    await asyncio.sleep(0.05)
    assert log.count("plan a") == 1 and "plan c" not in log
    release["a"].set()  # a's rest ends: its room goes to c, which the worker already holds
    await _until(lambda: "plan c" in log)
    assert log.index("rest a ends") < log.index("plan c") and log.count("plan a") == 1
    release["b"].set()  # a room again: the poked a is handled once more
    await _until(lambda: log.count("plan a") == 2)
    release["c"].set()  # c's rest fails: it is retried with backoff
    await _until(lambda: log.count("plan c") == 2)
    for key in ("a", "c"):
        release[key].set()
    await _until(lambda: queue.idle)
    worker.cancel()


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.001)
