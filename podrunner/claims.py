"""What a pod's processes hold on this machine that its successor must not take while they run: its IP and
its state directory.

kwok hands a deleted pod's IP to the next pod at once, while the processes of the deleted pod may still be
stopping (within their grace period, or killed late by a runner that saw the deletion only after kwok's
fallback removed the object); a real node's network plugin frees an IP only once the pod's sandbox is gone.
And a pod created again under the same name gets the same directory (its logs stay together). So a pod's
containers start only once no other pod holds its IP or its directory; otherwise the successor fails with
"Address already in use" on a port its predecessor still binds, or wipes the shared memory it still uses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager


class Claims:
    def __init__(self) -> None:
        self._holders: dict[str, str] = {}  # what is held (an IP, a directory) -> the uid of the pod holding it
        self._freed = asyncio.Condition()

    def others(self, things: Collection[str], uid: str) -> dict[str, str]:
        """Which of `things` another pod holds now, and which pod."""
        return {t: self._holders[t] for t in things if self._holders.get(t, uid) != uid}

    @asynccontextmanager
    async def held(self, things: Collection[str], uid: str) -> AsyncIterator[None]:
        """Waits until no other pod holds any of `things`, then holds them all for the pod `uid` until the
        block ends. All at once, so two pods never each hold half of what the other waits for."""
        async with self._freed:
            await self._freed.wait_for(lambda: not self.others(things, uid))
            for thing in things:
                self._holders[thing] = uid
        try:
            yield
        finally:
            async with self._freed:
                for thing in things:
                    if self._holders.get(thing) == uid:
                        del self._holders[thing]
                self._freed.notify_all()
