"""The operator's one client to engines and routers (`engines.engine_client.EngineClient`), over real HTTP on 127.0.0.1:
a real rank-health agent, and a small server standing in for what a broken or hostile endpoint may answer. Every
way a request can fail is one answer (None or False); only the pod's own IP is contacted; no proxy from the
environment is used unless a person asked for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web

from pdfleet.operator.api.roles import Role
from pdfleet.operator.engines import engine_client
from pdfleet.operator.engines.engine_client import MAX_BODY, EngineClient
from pdfleet.operator.planning.router.router_membership import Registered, Worker
from pdfleet.operator.render.engine_group import AGENT_PORT
from pdfleet.runtime.health import agent, attach, phases
from tests.support.operator_process import free_port

KEY = "router-key"


def pod(name: str = "g-0", ip: str | None = "127.0.0.1", uid: str = "u") -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid}, "status": {"podIP": ip} if ip else {}}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[int]:
    ledger = tmp_path / "ledger"
    w = attach.attach_rank(slot=0, rank=0, slots=1, path=ledger, stack_signal=None)
    w.set_loop(phases.LoopName.EVENT_LOOP_NORMAL)
    w.begin(phases.Phase.FORWARD)
    with agent.Agent(ledger, host="127.0.0.1", port=0) as a:
        yield a.port
    w.close()


class Endpoint:
    """An engine and router on one port, answering the paths the client asks in every way that must not hurt it;
    `seen` records each request as (method, path, authorization)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        self.workers = [{"id": "w1", "url": "http://127.1.0.9:30000", "worker_type": "decode"}]
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path_qs, request.headers.get("Authorization")))
        if request.path == "/server_info":
            return web.json_response({"disable_overlap_schedule": True, "tp_size": 2, "mem_fraction_static": 0.8})
        if request.path == "/huge":  # chunked: no Content-Length to refuse it by
            response = web.StreamResponse()
            await response.prepare(request)
            for _ in range(MAX_BODY // 65536 + 2):
                await response.write(b"x" * 65536)
            await response.write_eof()
            return response
        if request.path == "/moved":
            raise web.HTTPFound("/server_info")
        if request.path == "/metrics":
            return web.Response(text="no counters here\n")
        if request.path.startswith("/workers"):
            if request.headers.get("Authorization") != f"Bearer {KEY}":
                return web.json_response({"error": "unauthorized"}, status=401)
            if request.method == "GET":
                return web.json_response({"workers": self.workers})
            return web.json_response({"ok": True})
        return web.Response(status=404)


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    server = Endpoint()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def engines() -> AsyncIterator[EngineClient]:
    client = EngineClient(timeout=1.0)
    try:
        yield client
    finally:
        await client.close()


def test_the_default_address_is_the_pods_ip_and_the_port_asked_and_nothing_else() -> None:
    assert engine_client.pod_address(pod(ip="127.1.0.2"), AGENT_PORT) == ("127.1.0.2", AGENT_PORT)
    assert engine_client.pod_address(pod(ip=None), 30000) is None
    assert engine_client.pod_address(pod(ip="evil.example.com"), 30000) is None


async def test_a_live_agent_answers_with_its_ranks(served: int) -> None:
    client = EngineClient(addressing=lambda _pod, port: ("127.0.0.1", served) if port == AGENT_PORT else None)
    try:
        answers = await client.ranks_all([pod("a"), pod("b")])
    finally:
        await client.close()

    assert set(answers) == {"a", "b"}
    assert [e.record.phase for e in answers["a"].ranks] == [phases.Phase.FORWARD]


async def test_a_silent_or_unaddressable_pod_reads_as_no_answer() -> None:
    port = free_port()  # nothing listens there
    client = EngineClient(addressing=lambda p, _port: ("127.0.0.1", port) if p["status"] else None, timeout=0.5)
    try:
        answers = await client.ranks_all([pod("silent"), pod("no-ip", ip=None)])
    finally:
        await client.close()

    assert answers == {"silent": None, "no-ip": None}


async def test_server_info_keeps_only_the_compared_fields(endpoint: Endpoint, engines: EngineClient) -> None:
    info = await engines.server_info(pod(), endpoint.port)
    assert info == {"disable_overlap_schedule": True, "tp_size": 2}


async def test_what_is_not_a_plain_answer_reads_as_none(endpoint: Endpoint, engines: EngineClient) -> None:
    assert await engines.agent_json(pod(), path="") is None  # the agent port: nothing listens
    assert await engines._get(engines.url(pod(), endpoint.port, "/huge")) is None, "more than MAX_BODY, chunked"
    assert await engines._get(engines.url(pod(), endpoint.port, "/moved")) is None, "a redirect is not followed"
    assert ("GET", "/server_info", None) not in endpoint.seen
    assert await engines.metrics(pod(), endpoint.port) is None, "a /metrics without SGLang's counters"
    assert await engines.server_info(pod(ip="not-an-ip"), endpoint.port) is None
    assert all(path != "/server_info" for _, path, _ in endpoint.seen), "a pod without an IP address is not asked"


async def test_the_worker_api_carries_the_routers_key(endpoint: Endpoint, engines: EngineClient) -> None:
    router = pod("pool-router-x")
    assert await engines.workers(router, endpoint.port, None) is None, "refused without the key"
    assert await engines.workers(router, endpoint.port, KEY) == [
        Registered(id="w1", url="http://127.1.0.9:30000", worker_type="decode")]
    assert await engines.remove_worker(router, endpoint.port, KEY, Registered("w1", "u", "decode"))
    added = Worker(url="http://127.1.0.8:30000", role=Role.PREFILL, group="g", bootstrap_port=8998)
    assert await engines.add_worker(router, endpoint.port, KEY, added)
    assert not await engines.add_worker(router, endpoint.port, "wrong", added)
    assert not await engines.add_worker(pod(ip=None), endpoint.port, KEY, added)
    assert [(m, p) for m, p, auth in endpoint.seen if auth == f"Bearer {KEY}"] == [
        ("GET", "/workers"), ("DELETE", "/workers/w1"), ("POST", "/workers")]


@pytest.mark.parametrize("trust_env", [False, True])
async def test_a_proxy_in_the_environment_is_used_only_when_a_person_asked(
        endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch, trust_env: bool) -> None:
    proxy = Endpoint()  # answers whatever reaches it: were it used, it would see the request
    await proxy.start()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    client = EngineClient(timeout=2.0, trust_env=trust_env)
    try:
        await client.server_info(pod(), endpoint.port)
        with pytest.raises(openai.APIError):  # the endpoint has no OpenAI API; only who was asked matters
            await client.openai(f"http://127.0.0.1:{endpoint.port}", timeout=2.0).models.list()
    finally:
        await client.close()
        await proxy.stop()
    proxied = [path for _, path, _ in proxy.seen]
    direct = [path for _, path, _ in endpoint.seen]
    if trust_env:
        assert len(proxied) == 2, "with trust_env the environment's proxy carries both transports' requests"
    else:
        assert proxied == [] and direct == ["/server_info", "/v1/models"]
