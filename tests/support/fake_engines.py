"""What the operator talks to over HTTP besides the apiserver, as small real servers on loopback addresses.

- `FakeAgent`: a pod's rank-health agent, serving `GET /ranks` in the agent's own wire format
  (`report.to_json`) with whatever ranks the test sets. The real agent (`runtime.health.agent`) reads a
  shared-memory ledger whose phase ages come from the clock; this one lets a test say "these two ranks have
  sat in different collectives for 40 s" without waiting 40 s.
- `FakeRouter`: sglang-router's worker API (`GET /workers`, `DELETE /workers/{id}`, `POST /workers`; with `key`
  set, 401 without it as a bearer token, as with `--control-plane-api-keys`), keeping
  the worker list and every request it got.

Each listens on its own 127.x.y.z address (every 127/8 address is loopback on Linux) and a free port, so pods
keep distinct IPs as in a cluster and the operator's clients address them the way they address pods: from
`status.podIP`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from pdfleet.runtime.health import phases, records, report

Body = dict[str, Any]
S = 1_000_000_000


class _Server:
    """One aiohttp app on `host:port` (port 0: any free one), and the requests it got."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.port = 0
        self.requests: list[tuple[str, str, Any]] = []  # (method, path with query, JSON body or None)
        self._runner: web.AppRunner | None = None
        self._arrived = asyncio.Condition()

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> int:
        app = web.Application(middlewares=[self._record])
        self.routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)  # 0 unless set: any free port
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.port

    async def close(self) -> None:
        """Stops listening: from now on a connection is refused, as to a pod whose process is gone."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_requests(self, n: int, timeout: float = 5.0) -> None:
        """Until the server has had `n` requests in all."""
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: len(self.requests) >= n), timeout)

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        async with self._arrived:
            self.requests.append((request.method, request.path_qs, body))
            self._arrived.notify_all()
        return await handler(request)


def rank(n: int, phase: phases.Phase = phases.Phase.FORWARD, *, age_s: float = 0.01, collectives: int = 10,
         alive: bool = True, loop: phases.LoopName = phases.LoopName.EVENT_LOOP_NORMAL) -> report.RankEntry:
    """One rank as an agent reports it: in `phase` for `age_s`, having entered `collectives` collectives."""
    record = records.RankRecord(slot=n, rank=n, pid=100 + n, pid_start=1, loop=loop, phase=phase, phase_since_ns=0,
                                iteration=5, collectives=collectives, stack_signal=0, attached_ns=0, consistent=True)
    return report.RankEntry(record=record, alive=alive, phase_age_ns=round(age_s * S))


def healthy(tp: int) -> list[report.RankEntry]:
    return [rank(n) for n in range(tp)]


def desynced(age_s: float) -> list[report.RankEntry]:
    """Two ranks stuck in different collectives for `age_s`: the overlap-abort failure."""
    return [rank(0, phases.Phase.RECV_BROADCAST, age_s=age_s, collectives=11),
            rank(1, phases.Phase.KV_POLL_ALL_REDUCE, age_s=age_s, collectives=10)]


class FakeAgent(_Server):
    def __init__(self, host: str, ranks: Sequence[report.RankEntry] = ()) -> None:
        super().__init__(host)
        self.ranks = list(ranks)
        self.now_ns = 1  # the agent's monotonic clock as its answers carry it (ranks' attached_ns are on it)
        self.on_ask: Callable[[], None] | None = None  # runs as each /ranks is answered (the world moving on)

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/ranks", self._ranks)

    async def _ranks(self, _: web.Request) -> web.Response:
        if self.on_ask is not None:
            self.on_ask()
        answer = report.PodReport(ledger="/dev/shm/pdfleet-ledger", now_ns=self.now_ns, ranks=tuple(self.ranks))
        body = report.to_json(answer)
        return web.json_response(body)


class FakeRouter(_Server):
    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.workers: list[Body] = []  # as GET /workers lists them
        self.failing: set[str] = set()  # the methods it answers with 500
        self.key: str | None = None  # when set, the worker API wants it as a bearer token (401 otherwise)
        self.outcomes: dict[str, tuple[int, int]] = {}  # worker URL -> (succeeded, failed), as its metrics show
        self._ids = itertools.count(1)

    def register(self, url: str, worker_type: str, **extra: Any) -> str:
        """A worker as the router's own discovery registers it; returns its id."""
        worker_id = f"w{next(self._ids)}"
        self.workers.append({"id": worker_id, "url": url, "worker_type": worker_type, **extra})
        return worker_id

    def urls(self) -> dict[str, str]:
        return {w["url"]: w["worker_type"] for w in self.workers}

    def changes(self) -> list[tuple[str, str, Any]]:
        """The requests that were not listings."""
        return [r for r in self.requests if r[0] != "GET"]

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/workers", self._list)
        app.router.add_delete("/workers/{id}", self._remove)
        app.router.add_post("/workers", self._add)
        app.router.add_get("/metrics", self._metrics)  # sglang-router serves it on a port of its own; see fake_fleet

    async def _metrics(self, _request: web.Request) -> web.Response:
        lines = ["# TYPE smg_worker_cb_outcomes_total counter"]
        for url, (ok, failed) in self.outcomes.items():
            lines += [f'smg_worker_cb_outcomes_total{{worker="{url}",outcome="success"}} {ok}',
                      f'smg_worker_cb_outcomes_total{{worker="{url}",outcome="failure"}} {failed}']
        return web.Response(text="\n".join(lines) + "\n")

    def _refused(self, request: web.Request) -> web.Response | None:
        if self.key is not None and request.headers.get("Authorization") != f"Bearer {self.key}":
            return web.Response(status=401, text="Missing or invalid Authorization header")
        return None

    async def _list(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        if "GET" in self.failing:
            return web.json_response({"error": "broken"}, status=500)
        return web.json_response({"workers": self.workers, "total": len(self.workers)})

    async def _remove(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        if "DELETE" in self.failing:
            return web.json_response({"error": "broken"}, status=500)
        before = len(self.workers)
        self.workers = [w for w in self.workers if w["id"] != request.match_info["id"]]
        if len(self.workers) == before:
            return web.json_response({"error": "no such worker"}, status=404)
        return web.json_response({"status": "removed"})

    async def _add(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        body = await request.json()
        if "POST" in self.failing:
            return web.json_response({"error": "broken"}, status=500)
        if any(w["url"] == body.get("url") for w in self.workers):
            return web.json_response({"error": "already registered"}, status=409)
        self.register(body["url"], body.get("worker_type", "regular"),
                      **({"bootstrap_port": body["bootstrap_port"]} if "bootstrap_port" in body else {}))
        return web.json_response({"status": "added"})


class FakeEngine(_Server):
    """An SGLang engine's `GET /server_info` (`args` stands for its resolved ServerArgs fields) and `GET /metrics`
    (`metrics`: the Prometheus text it shows; empty, a 404 as without --enable-metrics)."""

    def __init__(self, host: str, args: Body | None = None) -> None:
        super().__init__(host)
        self.args: Body = dict(args or {})
        self.metrics = ""

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/metrics", self._metrics)

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=self.metrics) if self.metrics else web.Response(status=404)

    async def _server_info(self, _: web.Request) -> web.Response:
        return web.json_response({**self.args, "version": "0.5.23", "internal_states": [{}]})
