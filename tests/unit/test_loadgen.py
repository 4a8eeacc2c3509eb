"""The client load's counting: what is a failure, and what it reports (pure parts of `pdfleet-sim load`); its open
loop (rate steps, ramps, phases) against a stand-in with a capacity on 127.0.0.1."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import openai
import pytest
from aiohttp import web

from pdfleet.podrunner import loadgen
from pdfleet.podrunner.loadgen import Step


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


async def serve_stub(before: Callable[[], Awaitable[None]]) -> tuple[web.AppRunner, str]:
    """A stand-in for a router on 127.0.0.1: /generate and chat completions (streamed or not) answer "ok" once
    `before()` returned. Returns its runner (to clean up) and URL."""

    async def generate(_: web.Request) -> web.Response:
        await before()
        return web.json_response({"text": "ok"})

    async def chat(request: web.Request) -> web.StreamResponse:
        await before()
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
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_with_endpoints_each_request_goes_to_an_endpoint_listed_at_that_moment() -> None:
    """A client behind a Service: it follows the ready endpoints as they change, never a listed-out one."""

    hits: dict[str, int] = {}

    async def serve(name: str) -> tuple[web.AppRunner, str]:
        async def hit() -> None:
            hits[name] = hits.get(name, 0) + 1
        return await serve_stub(hit)

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


SLOTS, SERVICE_S = 2, 0.1  # the open loop's server: 20 answers a second at most


def test_steps_parse_as_rate_x_seconds_and_bad_ones_say_why() -> None:
    assert loadgen.parse_steps("5x30, 20x60,0x10") == [Step(5, 30), Step(20, 60), Step(0, 10)]
    for bad in ("5", "5x", "ax30", "5x0", "-1x30", "5:30"):
        with pytest.raises(ValueError, match="RATExSECONDS"):
            loadgen.parse_steps(bad)


def test_a_ramp_is_a_staircase_from_start_to_peak_and_down_to_end() -> None:
    steps = loadgen.ramp(5, 60, 5, 180, 15)
    assert len(steps) == 13  # 12 steps of 15 s, made odd so that one step is the peak
    assert [s.rate for s in steps[:7]] == [5, 14.17, 23.33, 32.5, 41.67, 50.83, 60]
    assert [s.rate for s in steps[6:]] == [60, 50.83, 41.67, 32.5, 23.33, 14.17, 5]
    assert sum(s.seconds for s in steps) == pytest.approx(180, abs=0.01)
    assert loadgen.ramp(2, 8, 0, 10, 100) == [Step(2, 3.333), Step(8, 3.333), Step(0, 3.333)]  # at least 3
    assert loadgen.parse_ramp("5:60:5", 180, 15) == steps
    with pytest.raises(ValueError, match="START:PEAK:END"):
        loadgen.parse_ramp("5:60", 180, 15)


def test_the_cli_refuses_a_bad_schedule_before_sending_anything(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--steps", "5"], ["--ramp", "5:60"], ["--rate", "0"], ["--rate", "5", "--steps", "5x1"]):
        with pytest.raises(SystemExit) as exited:
            loadgen.main(["--url", "http://127.0.0.1:9", *bad])
        assert exited.value.code == 2, bad
    assert "RATExSECONDS" in capsys.readouterr().err


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """A router stand-in with a capacity: requests beyond its SLOTS wait for one."""
    slots = asyncio.Semaphore(SLOTS)

    async def served() -> None:
        async with slots:
            await asyncio.sleep(SERVICE_S)

    runner, url = await serve_stub(served)
    try:
        yield url
    finally:
        await runner.cleanup()


async def test_each_step_sends_its_rate_whatever_the_answers_take_and_reports_what_its_requests_saw(
        server: str) -> None:
    load = loadgen.Load(server, timeout_s=10)
    reported: list[int] = []
    phases = await load.run_steps([Step(5, 1.0), Step(40, 1.0), Step(5, 1.0)],
                                  report=lambda phase: reported.append(phase.tally.sent))
    # Requests start on the schedule: rate x seconds of them in each phase, each phase reported as it ended.
    assert [p.tally.sent for p in phases] == [5, 40, 5] == reported
    assert load.tally.sent == 50 and load.tally.failed == 0
    low, high, after = (p.summary() for p in phases)
    assert all(s["ok"] == s["sent"] and s["failed"] == 0 and s["in_flight"] == 0 for s in (low, high, after))
    # Twice what the server answers: the busy phase's requests queued, the quiet ones' did not.
    assert high["p50_ms"] > 2 * low["p50_ms"], (low, high)
    assert high["p99_ms"] >= high["p50_ms"]
    assert 30 <= high["sent_per_s"] <= 41, high  # 40 sent in the phase's 1 s (or a little more, on a busy machine)
    assert "40/s x 1s" in phases[1].line() and "failed 0" in phases[1].line()


async def test_a_stopped_load_ends_its_phase_and_sends_no_more(server: str) -> None:
    load = loadgen.Load(server, timeout_s=10)
    run = asyncio.create_task(load.run_steps([Step(20, 30.0), Step(20, 30.0)]))
    while load.tally.ok < 5:
        await asyncio.sleep(0.01)
    load.stop()
    phases = await asyncio.wait_for(run, 10)
    assert len(phases) == 1 and phases[0].elapsed_s < 30
    assert phases[0].tally.sent == load.tally.sent < 600
