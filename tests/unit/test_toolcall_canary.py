"""The tool-call canary's plan and verdicts (pure), and `pdfleet canary`'s output and exit codes."""

from __future__ import annotations

import json

import pytest

from pdfleet.operator.cli import canary as cli_canary
from pdfleet.operator.cli.__main__ import main
from pdfleet.operator.planning import toolcall_canary as tc
from pdfleet.operator.planning.toolcall_canary import Answer, Probe, ToolCall
from pdfleet.runtime.simulator import toolcalls as sim
from pdfleet.runtime.simulator.faults import Fault
from pdfleet.runtime.toolcalls.markup import Cause
from tests.support.operator_process import free_port

TOOL = Probe(0, "auto", stream=True)
PLAIN = Probe(1, None, stream=False)
GOOD = ToolCall("get_weather", '{"city": "Paris"}')


def leaked(fault: Fault, *, parser: str | None = "deepseekv32") -> str:
    """The content the simulator puts out under a leak fault (as SGLang does for that cause)."""
    body = {"tools": tc.TOOLS, "tool_choice": "auto"}
    answer = sim.answer(body, parser=parser, fault=fault, plain_alongside=True)
    assert answer.call is None and answer.content
    return answer.content


def test_the_plan_interleaves_tool_and_plain_requests_streamed_and_not_auto_and_required() -> None:
    probes = tc.plan(16)
    assert [p.tools for p in probes] == [True, False] * 8
    kinds = {(p.tool_choice, p.stream) for p in probes}
    assert kinds == {("auto", True), ("auto", False), ("required", True), ("required", False), (None, True),
                     (None, False)}
    body = tc.body(probes[0], model="m", max_tokens=8)
    assert body["tools"] == tc.TOOLS and body["tool_choice"] == "auto" and body["stream"] is True
    assert body["max_completion_tokens"] == 8 and "max_tokens" not in body
    assert "tools" not in tc.body(probes[1], model="m", max_tokens=8)


def test_a_structured_call_and_plain_text_pass() -> None:
    assert tc.judge(TOOL, Answer("", (GOOD,), "tool_calls")).ok
    assert tc.judge(PLAIN, Answer("The sea is <b>wide</b>; a < b.", (), "stop")).ok


@pytest.mark.parametrize(("fault", "cause"), [
    (Fault.LEAK_STRIPPED_MARKERS, Cause.STRIPPED_MARKERS),
    (Fault.LEAK_PARSER_OFF, Cause.PARSER_OFF),
    (Fault.LEAK_WRONG_VERSION_MARKERS, Cause.WRONG_VERSION),
    (Fault.LEAK_MALFORMED_CALL, Cause.MALFORMED_CALL),
])
def test_markup_in_content_is_a_leak_with_its_cause(fault: Fault, cause: Cause) -> None:
    verdict = tc.judge(TOOL, Answer("Let me look. " + leaked(fault), (), "stop"), parser="deepseekv32")
    assert verdict.leaks == (cause,)
    assert not verdict.unanswered  # the leak explains the missing call: counted once, as the leak
    assert not verdict.ok and verdict.sample.startswith("Let me look. <") and "invoke" in verdict.sample


def test_the_v4_parser_expects_tool_calls_blocks() -> None:
    v4 = leaked(Fault.LEAK_PARSER_OFF, parser="deepseekv4")
    assert tc.judge(TOOL, Answer(v4), parser="deepseekv4").leaks == (Cause.PARSER_OFF,)
    assert tc.judge(TOOL, Answer(v4), parser="deepseekv32").leaks == (Cause.WRONG_VERSION,)
    # Without the server's parser the other version's block cannot be told from a parser that did not run.
    assert tc.judge(TOOL, Answer(v4), parser=None).leaks == (Cause.PARSER_OFF,)


def test_markup_in_a_plain_answer_is_parser_off() -> None:
    content = leaked(Fault.LEAK_PARSER_OFF)
    assert tc.judge(PLAIN, Answer(content)).leaks == (Cause.PARSER_OFF,)


def test_a_lone_marker_outside_any_block_still_fails() -> None:
    assert tc.judge(TOOL, Answer("text ｜DSML｜ more"), parser="deepseekv32").leaks == (Cause.MALFORMED_CALL,)


@pytest.mark.parametrize(("call", "why"), [
    (ToolCall("launch_rockets", "{}"), "undeclared tool 'launch_rockets'"),
    (ToolCall("get_weather", '{"city": '), "arguments are not JSON"),
    (ToolCall("get_weather", "[1]"), "not a JSON object"),
    (ToolCall("get_weather", '{"days": 2}'), "required argument(s) missing: city"),
])
def test_malformed_structured_calls_are_named(call: ToolCall, why: str) -> None:
    verdict = tc.judge(TOOL, Answer("", (GOOD, call), "tool_calls"))
    assert len(verdict.malformed) == 1 and why in verdict.malformed[0]


def test_a_tool_request_answered_in_plain_text_is_unanswered() -> None:
    verdict = tc.judge(TOOL, Answer("It will be sunny.", (), "stop"))
    assert verdict.unanswered and not verdict.leaks


def test_the_report_passes_only_without_leaks_malformed_calls_unanswered_requests_or_errors() -> None:
    healthy = tc.report([(TOOL, Answer("", (GOOD,), "tool_calls")), (PLAIN, Answer("hi", (), "length"))])
    assert healthy.passed and healthy.failures() == []
    assert (healthy.requests, healthy.tool_requests, healthy.plain_requests, healthy.structured_calls) == (2, 1, 1, 1)
    assert not tc.report([]).passed and tc.report([]).failures() == ["no request was sent"]

    sick = tc.report([
        (TOOL, Answer(leaked(Fault.LEAK_STRIPPED_MARKERS))),
        (TOOL, Answer(leaked(Fault.LEAK_STRIPPED_MARKERS))),
        (TOOL, Answer("", (ToolCall("nope", "{}"),))),
        (TOOL, Answer("sunny")),
        (PLAIN, Answer(error="HTTP 503 InternalServerError")),
        (TOOL, Answer("", (GOOD,), "tool_calls")),
    ], parser="deepseekv32")
    assert not sick.passed
    assert sick.leaks == {"stripped-markers": 2} and sick.malformed == 1 and sick.unanswered == 1
    assert sick.failures() == ["DSML markup in content (stripped-markers) in 2 answer(s)",
                               "1 malformed structured tool call(s)",
                               "1 tool request(s) answered without tool_calls",
                               "1 request(s) failed: HTTP 503 InternalServerError"]
    assert sick.samples["stripped-markers"].startswith("<function_calls>")
    doc = sick.to_json()
    assert doc["passed"] is False and doc["leaks"] == {"stripped-markers": 2} and doc["errors"] == {
        "HTTP 503 InternalServerError": 1}
    json.dumps(doc)


def test_the_summary_says_pass_or_each_cause() -> None:
    good = tc.report([(TOOL, Answer("", (GOOD,), "tool_calls"))])
    lines = cli_canary.summary_lines(good, url="http://127.0.0.1:1", concurrency=4)
    assert lines[-1].startswith("PASS")
    bad = tc.report([(TOOL, Answer(leaked(Fault.LEAK_WRONG_VERSION_MARKERS)))], parser="deepseekv32")
    lines = cli_canary.summary_lines(bad, url="http://127.0.0.1:1", concurrency=4)
    assert any(line.startswith("FAIL: DSML markup in content (wrong-version-markers)") for line in lines)
    assert any(line.startswith("  sample (wrong-version-markers)") for line in lines)


def test_the_command_exits_2_when_the_url_does_not_answer(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["canary", url, "--requests", "2", "--timeout", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {url}/v1/models") and "connection failed" in err


@pytest.mark.parametrize("argv", [["canary"], ["canary", "http://127.0.0.1:1", "--requests", "0"],
                                  ["canary", "http://127.0.0.1:1", "--tool-call-parser", "qwen"]])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
