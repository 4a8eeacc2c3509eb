"""The operator's door to its pools' routers: sglang-router's worker API on each router pod's IP.

    GET    /workers          the registered workers (id, url, worker_type, ...)
    DELETE /workers/{id}     remove one (by its id, not its URL)
    POST   /workers          add one: {"url", "worker_type", "bootstrap_port"}

Like `agents`, one class holds the session and translates every failure into one answer (None or False), and
only the pod's own IP is ever contacted. Every call carries the router pod's control-plane key as a bearer
token (`planning.router_keys`); without one, sglang-router answers 401.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from pdfleet.operator.planning import router_membership
from pdfleet.operator.planning.router_membership import Registered, Worker

log = logging.getLogger(__name__)

Body = dict[str, Any]
MAX_BODY = 4 * 1024 * 1024


def router_base(pod: Body, port: int) -> str | None:
    ip = router_membership.pod_ip(pod)
    return router_membership.worker_url(ip, port) if ip else None


class RouterClient:
    def __init__(self, *, timeout: float = 2.0, max_concurrent: int = 16) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._limit = asyncio.Semaphore(max_concurrent)
        self._session = aiohttp.ClientSession(trust_env=False, raise_for_status=False)

    async def close(self) -> None:
        await self._session.close()

    async def workers(self, base: str, key: str | None) -> list[Registered] | None:
        """The router's workers, or None when it does not answer with a list of them."""
        try:
            async with self._limit, self._session.get(f"{base}/workers", timeout=self._timeout,
                                                      headers=_auth(key), allow_redirects=False) as r:
                if r.status != 200 or (r.content_length or 0) > MAX_BODY:
                    if r.status in (401, 403):
                        log.warning("router %s refused the operator's key listing workers (%s)", base, r.status)
                    return None
                body = await r.json(content_type=None)
            return [Registered(id=str(w["id"]), url=str(w["url"]), worker_type=str(w.get("worker_type", "")))
                    for w in body["workers"]]
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError, TypeError) as e:
            log.debug("router %s did not list its workers: %r", base, e)
            return None

    async def remove(self, base: str, key: str | None, worker: Registered) -> bool:
        return await self._send("DELETE", f"{base}/workers/{worker.id}", key, None)

    async def add(self, base: str, key: str | None, worker: Worker) -> bool:
        body: Body = {"url": worker.url, "worker_type": str(worker.role)}
        if worker.bootstrap_port is not None:
            body["bootstrap_port"] = worker.bootstrap_port
        return await self._send("POST", f"{base}/workers", key, body)

    async def _send(self, method: str, url: str, key: str | None, body: Body | None) -> bool:
        try:
            async with self._limit, self._session.request(method, url, json=body, timeout=self._timeout,
                                                          headers=_auth(key), allow_redirects=False) as r:
                if r.status >= 300:
                    log.warning("router %s %s answered %s: %s", method, url, r.status, (await r.text())[:300])
                return r.status < 300
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.warning("router %s %s failed: %r", method, url, e)
            return False


def _auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}
