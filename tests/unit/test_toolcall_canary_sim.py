"""The engine simulator's tool calls, healthy and under each leak fault, cut by max_tokens inside the call
(healthy: as SGLang with the DSML leak guard's salvage; `truncated-call`: as 0.5.23 alone on V4's recipe route),
and `pdfleet canary` against it: one real simulated engine on 127.0.0.1 (no router;
`tests/integration/test_toolcall_canary_e2e.py` goes through the real router on the local cluster)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from pdfleet.operator.cli.__main__ import main
from pdfleet.operator.planning.rollout import toolcall_canary as tc
from pdfleet.runtime.simulator import toolcalls
from pdfleet.runtime.toolcalls.cut import json_object
from tests.support import sim_engine
from tests.support.canary import LEAKS, cut_call_returned, tool_answer_leaks
from tests.support.sim_engine import SimEngine


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimEngine]:
    e = sim_engine.start(tmp_path_factory.mktemp("sim"), "null", tp=1)
    try:
        e.wait_healthy(time.monotonic() + sim_engine.STARTUP_S)
        yield e
    finally:
        e.stop()


def ask_fault(engine: SimEngine, fault: str) -> None:
    """Annotate, and wait until the engine serves under it (the annotations are polled every 200 ms)."""
    engine.annotate(fault=fault)
    sim_engine.until(lambda: tool_answer_leaks(engine.url, "sim-model") == (fault in LEAKS) and
                     cut_call_returned(engine.url, "sim-model") == (fault == "truncated-call"),
                     time.monotonic() + 10, f"fault {fault} applied")


def cut_answers(engine: SimEngine, max_tokens: int) -> list[tuple[str | None, list[tuple[str, str]], str | None]]:
    """A tool request cut by `max_tokens`, streamed and not: (content, calls, finish_reason) of each."""
    client = openai.OpenAI(base_url=engine.url + "/v1", api_key="none", max_retries=0, timeout=10)
    kwargs: dict[str, Any] = {"model": "sim-model", "max_tokens": max_tokens, "tools": tc.TOOLS,
                              "messages": [{"role": "user", "content": "weather?"}]}
    choice = client.chat.completions.create(**kwargs).choices[0]
    answers = [(choice.message.content, [(c.function.name, c.function.arguments)  # type: ignore[union-attr]
                                         for c in choice.message.tool_calls or ()], choice.finish_reason)]
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            for call in c.delta.tool_calls or ():
                name, args = calls.get(call.index, ("", ""))
                calls[call.index] = (name + (call.function.name or ""),  # type: ignore[union-attr]
                                     args + (call.function.arguments or ""))  # type: ignore[union-attr]
            finish = c.finish_reason or finish
    return [*answers, (content or None, list(calls.values()), finish)]


def test_a_call_cut_by_max_tokens_comes_back_as_the_guard_answers_it_or_broken_under_the_fault(
        engine: SimEngine) -> None:
    ask_fault(engine, "none")
    for tokens in range(1, toolcalls.CALL_TOKENS):  # every cut inside the call: no call, `length`
        assert cut_answers(engine, tokens) == [(None, [], "length")] * 2, tokens
    whole = cut_answers(engine, toolcalls.CALL_TOKENS)
    assert [finish for _, _, finish in whole] == ["tool_calls"] * 2 and all(calls for _, calls, _ in whole)

    ask_fault(engine, "truncated-call")
    try:
        for tokens in range(1, toolcalls.CALL_TOKENS):
            answers = cut_answers(engine, tokens)
            assert answers[0] == answers[1], "the same broken call streamed and not"
            [(name, arguments)] = answers[0][1]
            assert name == "get_weather" and answers[0][2] == "length", answers
            assert '{"city": "pdfleet", "days": 1}'.startswith(arguments) and not json_object(arguments)
        assert cut_answers(engine, toolcalls.CALL_TOKENS) == whole, "a call not cut stays whole"
    finally:
        ask_fault(engine, "none")


def test_tool_requests_get_structured_calls_streamed_and_not(engine: SimEngine) -> None:
    ask_fault(engine, "none")
    client = openai.OpenAI(base_url=engine.url + "/v1", api_key="none", max_retries=0, timeout=10)
    chat = client.chat.completions.create(model="sim-model", max_tokens=4, tools=tc.TOOLS,  # type: ignore[arg-type]
                                          tool_choice={"type": "function", "function": {"name": "search"}},
                                          messages=[{"role": "user", "content": "find pdfleet"}])
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "search" and json.loads(call.function.arguments) == {"query": "pdfleet"}

    stream = client.chat.completions.create(model="sim-model", max_tokens=4, tools=tc.TOOLS,  # type: ignore[arg-type]
                                            stream=True, messages=[{"role": "user", "content": "weather?"}])
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    head = deltas[0].tool_calls[0]  # type: ignore[index]
    assert head.id and head.function.name == "get_weather"  # type: ignore[union-attr]
    arguments = "".join(d.tool_calls[0].function.arguments for d in deltas if d.tool_calls)  # type: ignore[union-attr,misc]
    assert json.loads(arguments) == {"city": "pdfleet", "days": 1}
    assert len([d for d in deltas if d.tool_calls]) > 2  # the arguments came in pieces
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    plain = client.chat.completions.create(model="sim-model", max_tokens=4, tools=tc.TOOLS,  # type: ignore[arg-type]
                                           tool_choice="none", messages=[{"role": "user", "content": "hi"}])
    assert plain.choices[0].message.content and plain.choices[0].message.tool_calls is None


def test_the_canary_passes_on_a_healthy_engine_and_names_each_leak(
        engine: SimEngine, capsys: pytest.CaptureFixture[str]) -> None:
    ask_fault(engine, "none")
    assert main(["canary", engine.url, "--requests", "32", "--concurrency", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] and doc["structuredCalls"] == doc["toolRequests"] == 16 and doc["model"] == "sim-model"
    assert (doc["cutRequests"], doc["cutMaxTokens"], doc["cutFailures"], doc["cutNotSent"]) == (2, 2, {}, None)

    for fault, cause in LEAKS.items():
        ask_fault(engine, fault)
        assert main(["canary", engine.url, "--requests", "32", "--concurrency", "8",
                     "--tool-call-parser", "deepseekv32"]) == 1, fault
        out = capsys.readouterr().out
        assert f"FAIL: DSML markup in content ({cause})" in out, out
        assert f"sample ({cause})" in out


def test_the_canary_names_a_call_cut_by_max_tokens_that_comes_back_broken(
        engine: SimEngine, capsys: pytest.CaptureFixture[str]) -> None:
    ask_fault(engine, "truncated-call")
    try:
        assert main(["canary", engine.url, "--requests", "8", "--json"]) == 1
        doc = json.loads(capsys.readouterr().out)
        assert doc["cutFailures"] == {"truncated-call": 2} and doc["leaks"] == {} and doc["malformedCalls"] == 0
        assert doc["failures"] == ["a call cut by max_tokens came back with arguments that are not a JSON object "
                                   "(truncated-call) in 2 answer(s)"]
        assert doc["samples"]["truncated-call"] == 'get_weather: {"city": "pdfle'
        assert main(["canary", engine.url, "--requests", "8"]) == 1
        out = capsys.readouterr().out
        assert "  cut inside the call by max_tokens 2: 2 answer(s) (truncated-call 2)" in out, out
        assert "FAIL: a call cut by max_tokens came back with arguments that are not a JSON object " \
               "(truncated-call) in 2 answer(s)" in out and "sample (truncated-call): " in out
    finally:
        ask_fault(engine, "none")
