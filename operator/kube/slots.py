"""A limit on concurrent API writes that lets some writes ahead of the queue."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator


class Slots:
    """At most `limit` holders at once. Waiters marked `first` are let in before the others, each kind in the
    order it came: a write that other writes wait on (a Role its RoleBinding waits for) must not queue behind
    the engine pods of every pool in a burst, once per link of its chain."""

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiting: tuple[collections.deque[asyncio.Future[None]], collections.deque[asyncio.Future[None]]] = \
            (collections.deque(), collections.deque())  # first, then the rest

    @contextlib.asynccontextmanager
    async def held(self, *, first: bool = False) -> AsyncIterator[None]:
        await self._acquire(first)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, first: bool) -> None:
        if self._free > 0 and not any(self._waiting):
            self._free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        queue = self._waiting[0 if first else 1]
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a slot just as it was cancelled: pass it on
            else:
                queue.remove(waiter)
            raise

    def _release(self) -> None:
        for queue in self._waiting:
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the slot passes straight to it
                    return
        self._free += 1
