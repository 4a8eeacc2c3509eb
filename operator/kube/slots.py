"""A limit on concurrent API writes that lets some writes ahead of the queue."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator


class Slots:
    """At most `limit` holders at once. Waiters are let in by rank (0 first), each rank in the order it came: in a
    burst of new pools the writes a new pool waits for longest (its engine pods) must not queue behind every other
    pool's Roles, RoleBindings and Deployments."""

    def __init__(self, limit: int, *, ranks: int = 2) -> None:
        self._free = limit
        self._waiting: tuple[collections.deque[asyncio.Future[None]], ...] = tuple(
            collections.deque() for _ in range(ranks))

    @property
    def ranks(self) -> int:
        return len(self._waiting)

    @contextlib.asynccontextmanager
    async def held(self, *, rank: int | None = None) -> AsyncIterator[None]:
        """A slot for as long as the block runs; `rank` None waits with the last rank."""
        await self._acquire(self.ranks - 1 if rank is None else rank)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, rank: int) -> None:
        if self._free > 0 and not any(self._waiting):
            self._free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        queue = self._waiting[rank]
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
