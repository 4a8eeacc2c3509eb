"""Rank-loop iterations, counted on the HTTP side's event loop: requests wait on them to make progress.

Rank 0 writes one byte to a non-blocking pipe per iteration; the event loop reads the pipe when it is
readable (no polling) and wakes whoever waits for the count to pass a mark.
"""

from __future__ import annotations

import asyncio
import os


class Ticks:
    def __init__(self, read_fd: int) -> None:
        self.count = 0
        self._fd = read_fd
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._fd, self._readable)

    def detach(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop = None

    def _readable(self) -> None:
        try:
            got = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            self.detach()
            return
        if not got:  # every writer is gone: no iteration will ever come again
            self.detach()
            return
        self.count += len(got)
        ready = [w for w in self._waiters if w[0] <= self.count]
        if ready:
            self._waiters = [w for w in self._waiters if w[0] > self.count]
            for _, fut in ready:
                if not fut.done():
                    fut.set_result(None)

    async def advance(self, n: int = 1) -> None:
        """Return once `n` more rank iterations completed (never, while the ranks are stuck)."""
        target = self.count + n
        if target <= self.count:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, fut))
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()
            self._waiters = [w for w in self._waiters if w[1] is not fut]
