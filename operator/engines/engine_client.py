"""The operator's one door to its engines and routers: every request it sends them goes through `EngineClient`.

    the rank-health agent      GET /ranks, /ranks/stacks        `ranks`, `agent_json`
    SGLang's HTTP API          GET /server_info, /metrics       `server_info`, `metrics`, `engine_metrics`
    sglang-router's worker API GET, POST /workers; DELETE /workers/{id}   `workers`, `add_worker`, `remove_worker`
    sglang-router's metrics    GET /metrics (its metrics port)  `routed`
    OpenAI-compatible API      the tool-call canary and bake probes      `openai`

One place therefore decides, for all of them: which address is contacted (only the pod's own `status.podIP`,
through `Addressing`; never a name to resolve), that no proxy from the environment is used, how long a request
may take, how many are in flight at once across every pool, how large an answer may be, and that a failure of
any kind (refused, timed out, not 200, too big, not JSON) is one answer, None or False, logged at debug. Code
above this module deals in reports, samples and workers, and never sees a transport.

Two transports, both owned here: aiohttp for the small control calls (the cheapest per request, and a health
poll of a hundred groups is a hundred of them a second), and one httpx client that every `openai` client shares
(the `openai` library speaks only httpx).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import httpx
import openai

from pdfleet.operator.api.status import ServingSample
from pdfleet.operator.planning.rollout import bake
from pdfleet.operator.planning.rollout.verification import SERVER_INFO_FIELDS
from pdfleet.operator.planning.router.router_membership import Registered, Worker, pod_ip, worker_url
from pdfleet.operator.planning.scale import engine_load
from pdfleet.operator.planning.scale.engine_load import LoadSample
from pdfleet.operator.render.engine_group import AGENT_PORT
from pdfleet.operator.render.router_objects import METRICS_PORT
from pdfleet.runtime import router_ready
from pdfleet.runtime.health import report

log = logging.getLogger(__name__)

Body = dict[str, Any]
# Where a pod's port is reached, as (host, port), or None when it cannot be (no IP yet). A local run or a test may
# map pods to other loopback addresses; the default is the pod's own IP and the port asked for.
Addressing = Callable[[Body, int], tuple[str, int] | None]

MAX_CONCURRENT = 64  # control requests in flight at once, across every pool of this operator
MAX_BODY = 4 * 1024 * 1024  # a rank report is a few KiB, /server_info tens, /metrics a few hundred
OPENAI_CONNECTIONS = 256  # canary and probe requests in flight at once; each run bounds its own concurrency
API_KEY = "pdfleet-operator"  # engines ignore it; the `openai` library insists on one


@dataclasses.dataclass(frozen=True)
class EngineMetrics:
    serving: ServingSample | None = None
    load: LoadSample | None = None


def pod_address(pod: Body, port: int) -> tuple[str, int] | None:
    """The default addressing: the pod's IP from its status (only if it is an address), and `port`."""
    ip = pod_ip(pod)
    return (ip, port) if ip is not None else None


def api_base(url: str) -> str:
    """The `openai` client's base URL for a server's URL (`…/v1` added unless given)."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class EngineClient:
    """Create and close it inside the event loop that uses it. `trust_env`: proxies from the environment; only a
    command a person runs against a URL they gave (`pdfleet canary`) turns it on, never the operator."""

    def __init__(self, *, addressing: Addressing = pod_address, timeout: float = 2.0,
                 max_concurrent: int = MAX_CONCURRENT, trust_env: bool = False) -> None:
        self._addressing = addressing
        self._timeout = timeout
        self._trust_env = trust_env
        self._limit = asyncio.Semaphore(max_concurrent)
        self._session = aiohttp.ClientSession(trust_env=trust_env, raise_for_status=False)
        self._httpx: httpx.AsyncClient | None = None  # made on the first `openai`: most operators never need it

    async def close(self) -> None:
        await self._session.close()
        if self._httpx is not None:
            await self._httpx.aclose()

    def url(self, pod: Body, port: int, path: str = "") -> str | None:
        """The URL of `path` on the pod's `port`, as this client addresses it; None when the pod has none."""
        address = self._addressing(pod, port)
        return worker_url(*address) + path if address is not None else None

    # --- the rank-health agent

    async def ranks_all(self, pods: Sequence[Body], *,
                        timeout: float | None = None) -> Mapping[str, report.PodReport | None]:
        """Every pod's report by pod name, None for each pod whose agent did not answer in time."""
        answers = await asyncio.gather(*(self.ranks(p, timeout=timeout) for p in pods))
        return dict(zip((p["metadata"]["name"] for p in pods), answers, strict=True))

    async def ranks(self, pod: Body, *, timeout: float | None = None) -> report.PodReport | None:
        """One pod's report, or None when its agent cannot be reached or does not answer with a report."""
        data = await self.agent_json(pod, timeout=timeout)
        if data is None:
            return None
        try:
            return report.from_json(data)
        except (ValueError, TypeError, KeyError) as e:
            log.debug("agent of %s sent no report: %r", pod["metadata"].get("name"), e)
            return None

    async def agent_json(self, pod: Body, *, path: str = "", timeout: float | None = None) -> Any | None:
        """The JSON a pod's agent serves at `/ranks<path>` (`/stacks?timeout=1`, say)."""
        return _json(await self._get(self.url(pod, AGENT_PORT, "/ranks" + path), timeout=timeout))

    # --- SGLang's own HTTP API

    async def server_info(self, pod: Body, port: int) -> Mapping[str, Any] | None:
        """The fields of the engine's /server_info that the verification gates compare (it carries hundreds), or
        None when it does not answer in time with a JSON object."""
        body = _json(await self._get(self.url(pod, port, "/server_info")))
        if not isinstance(body, dict):
            return None
        return {k: v for k, v in body.items() if k in SERVER_INFO_FIELDS}

    async def metrics(self, pod: Body, port: int) -> ServingSample | None:
        """The serving counters the engine's /metrics shows, or None when it does not answer in time with SGLang's
        request counters."""
        return (await self.engine_metrics(pod, port)).serving

    async def engine_metrics(self, pod: Body, port: int) -> EngineMetrics:
        """What one GET of the engine's /metrics shows: its serving counters (a bake's) and its load (the
        autoscaler's), each None when the answer does not carry it (or none came in time)."""
        uid = str(pod["metadata"].get("uid") or "")
        raw = await self._get(self.url(pod, port, "/metrics")) if uid else None
        if raw is None:
            return EngineMetrics()
        text = raw.decode("utf-8", "replace")
        return EngineMetrics(serving=bake.sample(uid, text), load=engine_load.parse(uid, text))

    # --- sglang-router's worker API; every call carries the router pod's control-plane key as a bearer token

    async def workers(self, router: Body, port: int, key: str | None) -> list[Registered] | None:
        """The router's registered workers, or None when it does not answer with a list of them."""
        url = self.url(router, port, "/workers")
        body = _json(await self._get(url, key=key))
        try:
            return [Registered(id=str(w["id"]), url=str(w["url"]), worker_type=str(w.get("worker_type", "")),
                               healthy=w.get("is_healthy") is not False)
                    for w in body["workers"]]
        except (KeyError, TypeError) as e:
            log.debug("router %s did not list its workers: %r", url, e)
            return None

    async def remove_worker(self, router: Body, port: int, key: str | None, worker: Registered) -> bool:
        return await self._send("DELETE", self.url(router, port, f"/workers/{worker.id}"), key, None)

    async def add_worker(self, router: Body, port: int, key: str | None, worker: Worker) -> bool:
        body: Body = {"url": worker.url, "worker_type": str(worker.role)}
        if worker.bootstrap_port is not None:
            body["bootstrap_port"] = worker.bootstrap_port
        return await self._send("POST", self.url(router, port, "/workers"), key, body)

    async def routed(self, router: Body) -> Mapping[str, tuple[float, float]] | None:
        """What the router saw of each worker it sends requests to (URL -> requests ended, of them failed), from
        its Prometheus port; None when it does not answer with metrics."""
        raw = await self._get(self.url(router, METRICS_PORT, "/metrics"))
        return bake.routed(raw.decode("utf-8", "replace")) if raw is not None else None

    async def circuit_states(self, router: Body) -> Mapping[str, int] | None:
        """Worker URL -> the state of its circuit breaker in `router` (0 closed, 1 open, 2 half-open), from its
        Prometheus port; None when it does not answer with metrics."""
        raw = await self._get(self.url(router, METRICS_PORT, "/metrics"))
        return router_ready.circuit_states(raw.decode("utf-8", "replace")) if raw is not None else None

    # --- the OpenAI-compatible API

    def openai(self, url: str, *, timeout: float) -> openai.AsyncOpenAI:
        """An `openai` client for the server at `url` over this client's shared transport: no retries (a failure
        is what a canary is there to see), `timeout` per request. Nothing to close: the transport is ours."""
        if self._httpx is None:
            limits = httpx.Limits(max_connections=OPENAI_CONNECTIONS, max_keepalive_connections=32)
            self._httpx = httpx.AsyncClient(limits=limits, trust_env=self._trust_env, follow_redirects=False,
                                            timeout=timeout)
        return openai.AsyncOpenAI(base_url=api_base(url), api_key=API_KEY, max_retries=0, timeout=timeout,
                                  http_client=self._httpx)

    # --- the transport

    async def _get(self, url: str | None, *, timeout: float | None = None, key: str | None = None) -> bytes | None:
        """The body of a 200 answer to GET `url`, or None: no URL, no answer in time, another status, or more than
        MAX_BODY (counted as it arrives: a chunked answer has no length to check first)."""
        if url is None:
            return None
        limit = aiohttp.ClientTimeout(total=timeout or self._timeout)
        try:
            async with self._limit, self._session.get(url, timeout=limit, headers=_auth(key),
                                                      allow_redirects=False) as r:
                if r.status != 200:
                    level = logging.WARNING if r.status in (401, 403) else logging.DEBUG
                    log.log(level, "%s answered %s", url, r.status)
                    return None
                body = bytearray()
                async for chunk in r.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > MAX_BODY:
                        log.debug("%s answered with more than %d bytes", url, MAX_BODY)
                        return None
                return bytes(body)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            log.debug("%s did not answer: %s", url, failure(e, key))
            return None

    async def _send(self, method: str, url: str | None, key: str | None, body: Body | None) -> bool:
        """Whether `method` on `url` answered 2xx. Writes are logged at warning when they fail: they change what a
        router serves, and an operator that cannot make them must say so."""
        if url is None:
            return False
        try:
            async with self._limit, self._session.request(method, url, json=body, headers=_auth(key),
                                                          timeout=aiohttp.ClientTimeout(total=self._timeout),
                                                          allow_redirects=False) as r:
                if r.status >= 300:
                    log.warning("%s %s answered %s: %s", method, url, r.status,
                                redacted((await r.text())[:300], key))
                return r.status < 300
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.warning("%s %s failed: %s", method, url, failure(e, key))
            return False


def failure(e: BaseException, key: str | None) -> str:
    """How a failed request is logged: its type and message, never its repr (an aiohttp ClientResponseError's repr
    holds the request's headers, the router's control-plane key among them), and never the key itself."""
    if isinstance(e, aiohttp.ClientResponseError):
        return redacted(f"{type(e).__name__}: status {e.status}, {e.message}", key)
    return redacted(f"{type(e).__name__}: {e}", key)


def redacted(text: str, key: str | None) -> str:
    """`text` without `key` (a router that echoes the request, or an error that quotes it)."""
    return text.replace(key, "<router key>") if key else text


def _json(raw: bytes | None) -> Any | None:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}
