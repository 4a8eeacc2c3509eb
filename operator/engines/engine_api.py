"""The operator's door to the engines' own HTTP API for verification: SGLang's `GET /server_info` and
`GET /metrics`.

Like `agents` and `routers`, one class holds the session and turns every failure (refused, timed out, not JSON
or not Prometheus text, too big) into one answer, None; only the pod's own IP (`status.podIP`) is ever contacted,
and no proxy from the environment is used. Of /server_info only the fields the verification gates compare are
kept (`verification.SERVER_INFO_FIELDS`): it carries hundreds; of /metrics only the request counters and latency
histograms a bake compares (`bake.sample`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aiohttp

from pdfleet.operator.api.status import ServingSample
from pdfleet.operator.planning import bake, router_membership
from pdfleet.operator.planning.verification import SERVER_INFO_FIELDS

log = logging.getLogger(__name__)

Body = dict[str, Any]
T = TypeVar("T")
MAX_BODY = 4 * 1024 * 1024  # /server_info is a few tens of KiB, /metrics a few hundred with every histogram


class EngineApiClient:
    """Reads `/server_info` and `/metrics` of engine pods. Create and close it inside the operator's event loop."""

    def __init__(self, *, timeout: float = 2.0, max_concurrent: int = 16) -> None:
        # No proxies from the environment (trust_env=False): engines are reached directly, or not at all; every
        # request of the session is bounded by `timeout`.
        self._session = aiohttp.ClientSession(trust_env=False, raise_for_status=False,
                                              timeout=aiohttp.ClientTimeout(total=timeout))
        self._limit = asyncio.Semaphore(max_concurrent)

    async def close(self) -> None:
        await self._session.close()

    async def _read(self, pod: Body, port: int, path: str,
                    read: Callable[[aiohttp.ClientResponse], Awaitable[T]]) -> T | None:
        """`read` of the engine's answer to GET `path` on `port` of the pod's IP; None when it has no IP, does not
        answer in time with a 200, answers with more than MAX_BODY, or `read` finds it unreadable."""
        ip = router_membership.pod_ip(pod)
        if ip is None:
            return None
        url = f"{router_membership.worker_url(ip, port)}{path}"
        try:
            async with self._limit, self._session.get(url, allow_redirects=False) as r:
                if r.status != 200 or (r.content_length or 0) > MAX_BODY:
                    log.debug("engine %s answered %s", url, r.status)
                    return None
                return await read(r)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            log.debug("engine %s did not answer: %r", url, e)
            return None

    async def metrics(self, pod: Body, port: int) -> ServingSample | None:
        """The serving counters the engine's /metrics shows, or None when it does not answer in time with SGLang's
        request counters."""
        uid = str(pod["metadata"].get("uid") or "")
        text = await self._read(pod, port, "/metrics", lambda r: r.text()) if uid else None
        return bake.sample(uid, text) if text is not None else None

    async def fetch(self, pod: Body, port: int) -> Mapping[str, Any] | None:
        """The compared fields of the engine's /server_info, or None when it does not answer in time with a JSON
        object."""
        body = await self._read(pod, port, "/server_info", lambda r: r.json(content_type=None))
        if not isinstance(body, dict):
            return None
        return {k: v for k, v in body.items() if k in SERVER_INFO_FIELDS}
