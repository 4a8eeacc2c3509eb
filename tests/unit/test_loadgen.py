"""The client load's counting: what is a failure, and what it reports (pure parts of `pdfleet-sim load`)."""

from __future__ import annotations

import time

import httpx
import openai

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
