"""A work queue of pool keys, in the manner of client-go's: level-based reconcile needs exactly this.

- A key waiting in the queue is there once, however many events poked it (they coalesce).
- A key is never handled by two workers at once; a key poked while it is being handled is handled again
  once more afterwards, so no change is lost.
- A failed key comes back after an exponential backoff; a success forgets its failures.
- An urgent key (a pool whose spec the operator has not handled yet) is handled before the others, so a burst
  of owned-object events from pools already created cannot make a new pool wait behind all of them (as
  controller-runtime's priority queue does for the events of an initial list).
- A handler may hand back the rest of its work (`run_detaching_worker`): the worker takes the next key while
  that rest runs, and the key counts as being handled until it ends, so the key is still never handled twice
  at once. At most `detached_limit` rests run at once; past that a worker waits for its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
log = logging.getLogger(__name__)


# Rests running at once. They wait on the operator's write slots (32 API writes at once, across all pools), not on
# this: it only bounds the memory of pools in flight. At 32, the 33rd pool of a burst could not queue its engine
# pods before a whole earlier pool's chain of writes (status and Events included) had ended.
DETACHED_LIMIT = 256


class Retry(Exception):
    """Raised by a handler that already reported why it failed: retry with backoff, log no traceback."""


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay: float = 0.5, max_delay: float = 60.0,
                 detached_limit: int = DETACHED_LIMIT) -> None:
        self._urgent: collections.deque[K] = collections.deque()
        self._normal: collections.deque[K] = collections.deque()
        self._waiting = asyncio.Semaphore(0)  # one count per queued key, whichever deque holds it
        self._queued: dict[K, bool] = {}  # key -> urgent
        self._active: set[K] = set()
        self._dirty: dict[K, bool] = {}  # poked while active -> urgent
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._detached_room = asyncio.Semaphore(detached_limit)
        self._detached: set[asyncio.Task[None]] = set()

    def add(self, key: K, *, urgent: bool = False) -> None:
        if key in self._active:
            self._dirty[key] = self._dirty.get(key, False) or urgent
        elif key not in self._queued:
            self._queued[key] = urgent
            (self._urgent if urgent else self._normal).append(key)
            self._waiting.release()
        elif urgent and not self._queued[key]:
            self._normal.remove(key)  # promoted: its place is with the urgent keys now
            self._queued[key] = True
            self._urgent.append(key)

    def add_after(self, key: K, delay: float) -> None:
        """Adds `key` once `delay` seconds have passed. A key already waiting keeps the earlier of the two
        deadlines (as client-go's delaying queue does): a prompt poke, such as an owned object's event, must
        not wait out a long failure backoff."""
        loop = asyncio.get_running_loop()
        pending = self._timers.get(key)
        if pending is not None:
            if pending.when() <= loop.time() + delay:
                return
            pending.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = loop.call_later(delay, fire)

    def forget(self, key: K) -> None:
        """Drops a key's failure history and pending retry (its object is gone)."""
        self._failures.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer:
            timer.cancel()

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def idle(self) -> bool:
        return not self._queued and not self._active

    async def _next(self) -> K:
        await self._waiting.acquire()
        key = (self._urgent or self._normal).popleft()
        del self._queued[key]
        self._active.add(key)
        return key

    def _done(self, key: K, *, failed: bool) -> None:
        self._active.discard(key)
        if failed:
            n = self._failures.get(key, 0) + 1
            self._failures[key] = n
            self.add_after(key, min(self._base_delay * 2 ** (n - 1), self._max_delay))
        else:
            self._failures.pop(key, None)
        if key in self._dirty:
            self.add(key, urgent=self._dirty.pop(key))

    async def run_worker(self, handle: Callable[[K], Awaitable[None]]) -> None:
        """Handles keys forever. `handle` raising means: retry later with backoff."""
        while True:
            key = await self._next()
            self._done(key, failed=not await self._ran(key, handle(key)))

    async def run_detaching_worker(self, handle: Callable[[K], Awaitable[Awaitable[None] | None]]) -> None:
        """Handles keys forever, like `run_worker`; `handle` may return the rest of its work instead of doing it,
        which then runs beside the next keys (the key is done, or retried, once the rest ends)."""
        while True:
            key = await self._next()
            await self._detached_room.acquire()
            handed: list[Awaitable[None]] = []

            async def first_part(key: K = key, handed: list[Awaitable[None]] = handed) -> None:
                if (rest := await handle(key)) is not None:
                    handed.append(rest)

            try:
                ran = await self._ran(key, first_part())
            except BaseException:
                self._detached_room.release()
                raise
            if not (ran and handed):
                self._detached_room.release()
                self._done(key, failed=not ran)
                continue
            task = asyncio.ensure_future(self._finish(key, handed[0]))
            self._detached.add(task)
            task.add_done_callback(self._detached.discard)

    async def _finish(self, key: K, rest: Awaitable[None]) -> None:
        try:
            self._done(key, failed=not await self._ran(key, rest))
        finally:
            self._detached_room.release()

    async def _ran(self, key: K, work: Awaitable[None]) -> bool:
        """Awaits `work`; False when it failed (to retry later with backoff)."""
        try:
            await work
        except asyncio.CancelledError:
            self._done(key, failed=False)
            raise
        except Retry:
            return False
        except Exception:
            log.exception("handling %s failed; retrying with backoff", key)
            return False
        return True

    def close(self) -> None:
        for task in list(self._detached):
            task.cancel()
        for timer in self._timers.values():
            with contextlib.suppress(Exception):
                timer.cancel()
        self._timers.clear()
