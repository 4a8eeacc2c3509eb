"""Work the caller does not wait for, bounded and accounted for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Detached:
    """Runs coroutines in the background, at most `concurrency` at a time, and keeps each until it ends (the
    loop holds only weak references to tasks). Their failures are logged, never raised: what is detached is
    what nobody may wait for, such as an Event about work already done."""

    def __init__(self, concurrency: int) -> None:
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(self._run(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, work: Coroutine[Any, Any, None]) -> None:
        async with self._slots:
            try:
                await work
            except Exception:
                log.exception("background work failed")

    async def drain(self, timeout: float | None = None) -> None:
        """Waits for everything spawned so far (up to `timeout` seconds), e.g. before the client closes."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    def __len__(self) -> int:
        return len(self._tasks)
