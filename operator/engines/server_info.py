"""The operator's door to the engines' own HTTP API for verification: SGLang's `GET /server_info`.

Like `agents` and `routers`, one class holds the session and turns every failure (refused, timed out, not JSON,
not an object) into one answer, None; only the pod's own IP (`status.podIP`) is ever contacted, and no proxy
from the environment is used. Of the answer only the fields the verification gates compare are kept
(`verification.SERVER_INFO_FIELDS`): /server_info carries hundreds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from pdfleet.operator.planning import router_membership
from pdfleet.operator.planning.verification import SERVER_INFO_FIELDS

log = logging.getLogger(__name__)

Body = dict[str, Any]
MAX_BODY = 4 * 1024 * 1024  # /server_info is a few tens of KiB


class ServerInfoClient:
    """Fetches `/server_info` from engine pods. Create and close it inside the operator's event loop."""

    def __init__(self, *, timeout: float = 2.0, max_concurrent: int = 16) -> None:
        # No proxies from the environment (trust_env=False): engines are reached directly, or not at all; every
        # request of the session is bounded by `timeout`.
        self._session = aiohttp.ClientSession(trust_env=False, raise_for_status=False,
                                              timeout=aiohttp.ClientTimeout(total=timeout))
        self._limit = asyncio.Semaphore(max_concurrent)

    async def close(self) -> None:
        await self._session.close()

    async def fetch(self, pod: Body, port: int) -> Mapping[str, Any] | None:
        """The compared fields of the engine's /server_info on `port` of the pod's IP, or None when it does not
        answer in time with a JSON object."""
        ip = router_membership.pod_ip(pod)
        if ip is None:
            return None
        url = f"{router_membership.worker_url(ip, port)}/server_info"
        try:
            async with self._limit, self._session.get(url, allow_redirects=False) as r:
                if r.status != 200 or (r.content_length or 0) > MAX_BODY:
                    log.debug("engine %s answered %s", url, r.status)
                    return None
                body = await r.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            log.debug("engine %s did not answer: %r", url, e)
            return None
        if not isinstance(body, dict):
            return None
        return {k: v for k, v in body.items() if k in SERVER_INFO_FIELDS}
