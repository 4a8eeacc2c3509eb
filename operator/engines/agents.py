"""The operator's only door to the engines' rank-health agents (docs/architecture.md, "Rank health").

Everything the operator asks an engine goes through `AgentClient.fetch`: one method, so concurrency is bounded
in one place and every failure (refused, timed out, not JSON, not a report) is translated here into one
answer, None: "this agent did not answer". Code above this module deals in `report.PodReport` and never sees
aiohttp.

Addressing is pluggable. By default an agent is reached at the pod's own IP (`status.podIP`) on
`AGENT_PORT`; a local run can pass another `Addressing` (a map from pods to loopback addresses, say). The
client contacts only the addresses that function returns, and the default returns only what the pod's
status gives.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from pdfleet.operator.render.engine_group import AGENT_PORT
from pdfleet.runtime.health import report

log = logging.getLogger(__name__)

Body = dict[str, Any]
# Where a pod's agent listens, as (host, port), or None when the pod cannot be reached (no IP yet).
Addressing = Callable[[Body], tuple[str, int] | None]

MAX_CONCURRENT = 64  # agent requests in flight at once, across every pool of this operator
MAX_BODY = 4 * 1024 * 1024  # a report of a few ranks is a few KiB; anything this large is not one


def pod_ip(pod: Body) -> tuple[str, int] | None:
    """The default addressing: the pod's IP from its status, and the agent port every engine pod declares."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    try:
        ipaddress.ip_address(ip)
    except ValueError:  # not an address: never let a status field turn into a host name to resolve
        return None
    return ip, AGENT_PORT


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/ranks" if ":" in host else f"http://{host}:{port}/ranks"


class AgentClient:
    """Fetches `/ranks` from engine pods. Create and close it inside the operator's event loop."""

    def __init__(self, *, addressing: Addressing = pod_ip, timeout: float = 2.0,
                 max_concurrent: int = MAX_CONCURRENT) -> None:
        self._addressing = addressing
        self._timeout = timeout
        self._limit = asyncio.Semaphore(max_concurrent)
        # No proxies from the environment (trust_env=False): agents are reached directly, or not at all.
        self._session = aiohttp.ClientSession(trust_env=False, raise_for_status=False)

    async def close(self) -> None:
        await self._session.close()

    async def fetch_all(self, pods: Sequence[Body], *,
                        timeout: float | None = None) -> Mapping[str, report.PodReport | None]:
        """Every pod's report by pod name, None for each pod whose agent did not answer in time."""
        names = [p["metadata"]["name"] for p in pods]
        answers = await asyncio.gather(*(self.fetch(p, timeout=timeout) for p in pods))
        return dict(zip(names, answers, strict=True))

    async def fetch(self, pod: Body, *, timeout: float | None = None) -> report.PodReport | None:
        """One pod's report, or None when its agent cannot be reached or does not answer with a report."""
        data = await self.fetch_json(pod, timeout=timeout)
        if data is None:
            return None
        try:
            return report.from_json(data)
        except (ValueError, TypeError, KeyError) as e:
            log.debug("agent of %s sent no report: %r", pod["metadata"].get("name"), e)
            return None

    async def fetch_json(self, pod: Body, *, path: str = "", timeout: float | None = None) -> Any | None:
        """The JSON a pod's agent serves at `/ranks<path>` (`/stacks?timeout=1`, say), or None when it does not
        answer in time, or not with JSON."""
        address = self._addressing(pod)
        if address is None:
            return None
        url = _url(*address) + path
        limit = aiohttp.ClientTimeout(total=timeout or self._timeout)
        try:
            async with self._limit, self._session.get(url, timeout=limit, allow_redirects=False) as response:
                if response.status != 200:
                    log.debug("agent %s answered %s", url, response.status)
                    return None
                if (response.content_length or 0) > MAX_BODY:
                    return None
                return await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            log.debug("agent %s did not answer: %r", url, e)
            return None
