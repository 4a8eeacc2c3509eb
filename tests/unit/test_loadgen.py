"""The client load's counting: what is a failure, and what it reports (pure parts of `pdfleet-sim load`)."""

from __future__ import annotations

import asyncio
import itertools
import time

import httpx
import openai
import pytest
from aiohttp import web

from pdfleet.podrunner import loadgen


def test_every_request_is_ok_failed_or_in_flight_and_failures_keep_their_cause() -> None:
    tally = loadgen.Tally()
    tally.sent = 5
    start = time.monotonic()
    tally.record("chat", start, None)
    tally.record("generate", start, None)
    tally.record("chat-stream", start, "truncated stream")
    tally.record("chat", start, "timeout")
    summary = tally.summary()
    assert (summary["ok"], summary["failed"], summary["in_flight"]) == (2, 2, 1)
    assert summary["failures"] == {"chat-stream: truncated stream": 1, "chat: timeout": 1}
    assert summary["ok_by_kind"] == {"chat": 1, "generate": 1}
    assert "failed 2" in tally.line() and "in flight 1" in tally.line()
    assert tally.first_failure_at is not None and tally.last_failure_at is not None


def test_errors_are_named_by_what_a_client_would_see() -> None:
    request = httpx.Request("POST", "http://127.0.0.1:1/generate")
    response = httpx.Response(503, request=request)
    assert loadgen._describe(httpx.HTTPStatusError("x", request=request, response=response)) == "HTTP 503"
    assert loadgen._describe(httpx.ReadTimeout("x", request=request)) == "timeout"
    assert loadgen._describe(httpx.ConnectError("x", request=request)) == "connection error"
    assert loadgen._describe(openai.APIConnectionError(request=request)) == "connection error"
    assert loadgen._describe(loadgen.BadAnswer("truncated stream")) == "truncated stream"
    assert loadgen._describe(KeyError("choices")) == "KeyError"


async def test_with_endpoints_each_request_goes_to_an_endpoint_listed_at_that_moment() -> None:
    """A client behind a Service: it follows the ready endpoints as they change, never a listed-out one."""

    hits: dict[str, int] = {}

    async def serve(name: str) -> tuple[web.AppRunner, str]:
        async def generate(_: web.Request) -> web.Response:
            hits[name] = hits.get(name, 0) + 1
            return web.json_response({"text": "ok"})

        async def chat(request: web.Request) -> web.StreamResponse:
            hits[name] = hits.get(name, 0) + 1
            if (await request.json()).get("stream"):
                out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await out.prepare(request)
                await out.write(b'data: {"choices": [{"delta": {"content": "ok"}}]}\n\ndata: [DONE]\n\n')
                return out
            return web.json_response({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": "ok"}}]})
        app = web.Application()
        app.router.add_post("/generate", generate)
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return runner, f"http://127.0.0.1:{port}"

    (first, a), (second, b) = await serve("a"), await serve("b")
    ready = [a]
    load = loadgen.Load("http://127.0.0.1:9", concurrency=2, timeout_s=5, endpoints=lambda: ready)
    run = asyncio.create_task(load.run())
    while load.tally.summary()["ok"] < 6:
        await asyncio.sleep(0.01)
    ready[:] = [b]  # the first endpoint leaves (its pod terminating); new requests go to the second only
    before = dict(hits)
    while hits.get("b", 0) < 6:
        await asyncio.sleep(0.01)
    load.stop()
    tally = await run
    await first.cleanup()
    await second.cleanup()
    assert tally.summary()["failed"] == 0
    assert hits["a"] <= before["a"] + 2, "at most the requests already in flight went to the listed-out endpoint"
    assert load.used == {a, b}


async def test_a_refused_connection_is_sent_again_to_the_next_endpoint_and_only_with_endpoints() -> None:
    async def generate(_: web.Request) -> web.Response:
        return web.json_response({"text": "ok"})
    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    good = f"http://127.0.0.1:{runner.addresses[0][1]}"
    closed = "http://127.0.0.1:9"  # nothing listens: the connection is refused, nothing was sent
    balanced = loadgen.Load(closed, concurrency=1, endpoints=lambda: [closed, good])
    fixed = loadgen.Load(closed, concurrency=1)
    try:
        await balanced._send(balanced._generate, 1)  # the first turn goes to the closed port, the retry not
        assert balanced.tally.retried == 1 and balanced.used == {closed, good}
        with pytest.raises(httpx.ConnectError):
            await fixed._send(fixed._generate, 1)  # one fixed address: nothing else to try
        assert fixed.tally.retried == 0

        # Other workers move the shared turn between a refusal and its retry: the retry still avoids the
        # endpoint that refused it (here every turn would pick the closed port).
        balanced._turn = itertools.repeat(0)  # type: ignore[assignment]
        await balanced._send(balanced._generate, 2)
        assert balanced.tally.retried == 2
    finally:
        await balanced._http.aclose()
        await fixed._http.aclose()
        await runner.cleanup()
