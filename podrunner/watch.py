"""List, then watch from the list's resourceVersion; on 410 Gone or any error, list again. The consumer
sees upserts and deletions only, including deletions that happened while no watch was open."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from pdfleet.podrunner.kube import ApiError, Client, Gone

log = logging.getLogger("pdfleet.podrunner.watch")
Body = dict[str, Any]
RETRY_S = (0.5, 1.0, 2.0, 5.0)


async def informer(client: Client, path: str, params: Mapping[str, str], *, on_upsert: Callable[[Body], None],
                   on_delete: Callable[[Body], None], on_synced: Callable[[], None]) -> None:
    known: dict[str, Body] = {}
    failures = 0
    while True:
        try:
            listing = await client.list(path, params)
            rv = listing["metadata"]["resourceVersion"]
            current = {item["metadata"]["uid"]: item for item in listing["items"]}
            for uid in known.keys() - current.keys():
                on_delete(known[uid])
            known = current
            for item in current.values():
                on_upsert(item)
            on_synced()
            failures = 0
            while True:  # one watch after another, each from the last resourceVersion seen
                async for event in client.watch(path, params, rv):
                    obj = event["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    uid = obj["metadata"]["uid"]
                    if event["type"] == "DELETED":
                        known.pop(uid, None)
                        on_delete(obj)
                    else:
                        known[uid] = obj
                        on_upsert(obj)
        except Gone:
            log.info("watch expired (410): listing again", extra={"fields": {"path": path}})
        except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as e:
            delay = RETRY_S[min(failures, len(RETRY_S) - 1)]
            failures += 1
            log.warning("watch failed: listing again", extra={"fields": {"path": path, "error": str(e)[:300],
                                                                          "retry_s": delay}})
            await asyncio.sleep(delay)
