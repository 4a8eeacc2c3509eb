"""The tool-call canary's plan and verdicts (pure), and `pdfleet canary`'s output and exit codes."""

from __future__ import annotations

import json

import pytest

from pdfleet.operator.cli import canary as cli_canary
from pdfleet.operator.cli.__main__ import main
from pdfleet.operator.planning.rollout import toolcall_canary as tc
from pdfleet.operator.planning.rollout import toolcall_cut as tc_cut
from pdfleet.operator.planning.rollout.toolcall_canary import Answer, Probe, ToolCall
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
    body = tc.body(probes[4], model="m", max_tokens=8)
    assert body["tools"] == tc.TOOLS and body["tool_choice"] == "required" and body["stream"] is True
    assert body["max_completion_tokens"] == tc.REFERENCE_MAX_TOKENS and "max_tokens" not in body, \
        "a tool request not cut on purpose has room for a whole call, whatever the plain requests' budget"
    assert "temperature" not in body and "stream_options" not in body
    plain = tc.body(probes[1], model="m", max_tokens=8)
    assert "tools" not in plain and plain["max_completion_tokens"] == 8


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


# --- the cut check: a tool request cut by its own max_tokens inside the call (docs/toolcalls.md) ---------------

CUT = 40  # the cut probes' max_tokens in these tests: half of a reference answer of 80 tokens
STREAMED_CUT = Probe(20, "auto", stream=True, cut_at=CUT)
CUT_PROBE = Probe(21, "auto", stream=False, cut_at=CUT)
BROKEN = ToolCall("get_weather", '{"city": "Pa')


def cut(*calls: ToolCall, finish: str | None = "length", content: str = "", tokens: int | None = CUT) -> Answer:
    return Answer(content, calls, finish, completion_tokens=tokens)


def test_the_first_tool_request_is_the_reference_greedy_with_room_for_a_whole_call() -> None:
    probes = tc.plan(8)
    assert [p.reference for p in probes] == [True] + [False] * 7 and not any(p.reference for p in tc.plain(4))
    body = tc.body(probes[0], model="m", max_tokens=8)
    assert body["max_completion_tokens"] == tc.REFERENCE_MAX_TOKENS and body["temperature"] == 0
    assert body["stream_options"] == {"include_usage": True}, "a streamed answer's length is asked for"


def test_the_cut_probes_ask_the_same_greedily_with_half_the_references_tokens_streamed_and_not() -> None:
    probes, why = tc.cuts(Answer("", (GOOD,), "tool_calls", completion_tokens=81), index=8)
    assert why is None and probes == [Probe(8, "auto", stream=True, cut_at=CUT),
                                      Probe(9, "auto", stream=False, cut_at=CUT)]
    streamed, answered = (tc.body(p, model="m", max_tokens=8) for p in probes)
    assert streamed["max_completion_tokens"] == answered["max_completion_tokens"] == CUT
    assert streamed["temperature"] == answered["temperature"] == 0 and streamed["tools"] == tc.TOOLS
    assert streamed["stream_options"] == {"include_usage": True} and "stream_options" not in answered


@pytest.mark.parametrize(("reference", "why"), [
    (Answer(error="timed out"), "the reference tool request failed (timed out)"),
    (Answer("sunny", (), "stop", completion_tokens=9), "the reference tool request was answered without tool_calls"),
    (Answer("", (GOOD,), "length", completion_tokens=256), "did not end within 256 tokens"),
    (Answer("", (GOOD,), "tool_calls", completion_tokens=1), "too short to cut (1 token(s))"),
    (Answer("", (GOOD,), "tool_calls"), "too short to cut (None token(s))"),
])
def test_no_cut_probe_is_sent_without_a_whole_reference_answer_to_cut(reference: Answer, why: str) -> None:
    probes, said = tc.cuts(reference, index=8)
    assert probes == [] and said is not None and why in said


def test_a_cut_answer_that_keeps_the_contract_passes() -> None:
    assert tc.judge(CUT_PROBE, cut()).ok, "the only call was cut: no call, length"
    assert tc.judge(CUT_PROBE, cut(GOOD, content="Let me look.")).ok, "a call complete before the cut"
    assert tc.judge(STREAMED_CUT, cut(tokens=None)).ok, "no usage said: taken as cut"


def test_a_cut_call_returned_with_arguments_that_are_not_json_is_a_truncated_call() -> None:
    verdict = tc.judge(CUT_PROBE, cut(GOOD, BROKEN, ToolCall("get_weather", '{"city": ')))
    assert verdict.cut == (("truncated-call", 'get_weather: {"city": "Pa'),), "once an answer, as the guard counts"
    assert not verdict.malformed and not verdict.ok
    # An answer that did not run out of tokens was not cut: a broken call there is malformed, as anywhere.
    whole = tc.judge(CUT_PROBE, cut(BROKEN, finish="tool_calls", tokens=12))
    assert not whole.cut and "arguments are not JSON" in whole.malformed[0]


def test_a_cut_answer_that_says_tool_calls_is_named() -> None:
    verdict = tc.judge(CUT_PROBE, cut(GOOD, finish="tool_calls"))
    assert [c for c, _ in verdict.cut] == ["cut-finish-reason"] and not verdict.ok
    both = tc.judge(STREAMED_CUT, cut(BROKEN, finish="tool_calls"))
    assert [c for c, _ in both.cut] == ["truncated-call", "cut-finish-reason"]


def test_markup_in_a_cut_answers_content_is_a_leak() -> None:
    block = leaked(Fault.LEAK_PARSER_OFF)
    verdict = tc.judge(CUT_PROBE, cut(content="Let me look. " + block[:len(block) // 2]), parser="deepseekv32")
    assert verdict.leaks and not verdict.ok


def test_streamed_and_not_streamed_cut_answers_that_differ_are_a_stream_mismatch() -> None:
    same = tc.report([(STREAMED_CUT, cut(ToolCall("get_weather", '{"city":"Paris"}'))),
                      (CUT_PROBE, cut(GOOD))])
    assert same.passed and same.cut_check() == "2 answer(s) cut inside the call by max_tokens 40, kept to the contract"
    assert (same.requests, same.cut_requests, same.tool_requests) == (2, 2, 0), "not the load's tool requests"
    for streamed in (cut(), cut(GOOD, finish="stop")):  # a call only one got; another finish reason
        rep = tc.report([(STREAMED_CUT, streamed), (CUT_PROBE, cut(GOOD))])
        assert rep.cut == {"stream-mismatch": 1} and not rep.passed
        assert rep.failures() == ["the streamed and non-streamed answers cut at the same max_tokens differ "
                                  "(stream-mismatch) in 1 pair(s)"]
        assert rep.samples["stream-mismatch"].startswith("streamed ((")
    # Only answers that both ran out of tokens are compared, and an error is nothing to compare.
    assert tc.report([(STREAMED_CUT, cut(tokens=12)), (CUT_PROBE, cut(GOOD))]).passed
    assert tc.report([(STREAMED_CUT, Answer(error="timed out")), (CUT_PROBE, cut(GOOD))]).cut == {}


def test_the_report_names_each_cut_cause_in_its_failures_and_json() -> None:
    rep = tc.report([(TOOL, Answer("", (GOOD,), "tool_calls")), (STREAMED_CUT, cut(BROKEN)),
                     (CUT_PROBE, cut(BROKEN, finish="tool_calls"))])
    assert rep.cut == {"truncated-call": 2, "cut-finish-reason": 1, "stream-mismatch": 1} and not rep.passed
    assert rep.tool_call_failures() == [
        "a call cut by max_tokens came back with arguments that are not a JSON object (truncated-call) in 2 answer(s)",
        "an answer cut by max_tokens inside its call ended with finish_reason tool_calls, not length "
        "(cut-finish-reason) in 1 answer(s)",
        "the streamed and non-streamed answers cut at the same max_tokens differ (stream-mismatch) in 1 pair(s)"]
    doc = rep.to_json()
    assert (doc["cutRequests"], doc["cutMaxTokens"], doc["cutNotSent"]) == (2, CUT, None)
    assert doc["cutFailures"] == {"truncated-call": 2, "cut-finish-reason": 1, "stream-mismatch": 1}
    assert doc["samples"]["truncated-call"] == 'get_weather: {"city": "Pa'
    json.dumps(doc)
    lines = cli_canary.summary_lines(rep, url="http://127.0.0.1:1", concurrency=4)
    assert "  cut inside the call by max_tokens 40: 2 answer(s) (truncated-call 2, cut-finish-reason 1, " \
           "stream-mismatch 1)" in lines
    assert lines[-4].startswith("FAIL: a call cut by max_tokens came back with arguments that are not a JSON")


def test_the_summary_says_when_no_cut_probe_was_sent_and_when_the_cut_answers_kept_the_contract() -> None:
    rep = tc.report([(TOOL, Answer("", (GOOD,), "tool_calls"))], cut_not_sent="the reference tool request failed")
    assert rep.passed and rep.to_json()["cutNotSent"] == "the reference tool request failed"
    lines = cli_canary.summary_lines(rep, url="http://127.0.0.1:1", concurrency=4)
    assert "  cut inside the call by max_tokens: no cut probe sent: the reference tool request failed" in lines
    kept = tc.report([(TOOL, Answer("", (GOOD,), "tool_calls")), (STREAMED_CUT, cut()), (CUT_PROBE, cut())])
    lines = cli_canary.summary_lines(kept, url="http://127.0.0.1:1", concurrency=4)
    assert lines[-2:] == ["  cut inside the call by max_tokens 40: 2 answer(s) kept to the contract",
                          "PASS: every tool request got structured tool_calls; no markup in content; calls cut by "
                          "max_tokens as the contract says; no errors"]


def test_the_cut_steps_over_the_references_prose_by_its_share_of_the_characters() -> None:
    call = ToolCall("get_weather", '{"city": "Paris"}')  # 28 characters of name and arguments
    assert tc_cut.budget(80) == 40 and tc_cut.budget(80, prose="   ", calls=[(call.name, call.arguments)]) == 40
    # 28 characters of prose beside 28 of call: half the tokens are taken as prose, the cut is half the rest.
    at = tc_cut.budget(80, prose="x" * 28, calls=[(call.name, call.arguments)])
    assert at == 40 + 20
    probes, _ = tc.cuts(Answer("x" * 28, (call,), "tool_calls", completion_tokens=80), index=8)
    assert {p.cut_at for p in probes} == {60}


def test_a_cut_that_stopped_in_the_prose_is_said_to_have_tested_nothing() -> None:
    prose = "Let me check the weather for you in Paris right now."
    reference = (Probe(0, "auto", stream=True, reference=True),
                 Answer(prose, (GOOD,), "tool_calls", completion_tokens=81))
    rep = tc.report([reference, (STREAMED_CUT, cut(content=prose[:20])), (CUT_PROBE, cut(content=prose[:20]))])
    assert rep.passed and rep.cut_in_prose == 2 and rep.to_json()["cutInProse"] == 2
    assert rep.cut_check() == "2 answer(s) cut by max_tokens 40 stopped in the prose before the call, testing nothing"
    lines = cli_canary.summary_lines(rep, url="http://127.0.0.1:1", concurrency=4)
    assert "  cut inside the call by max_tokens 40: 2 stopped in the prose before the call, testing nothing" in lines
    assert "calls cut by max_tokens" not in lines[-1], "the verdict claims no cut it did not test"
    # The whole prose and no call: the cut landed in the call, which was withheld as the contract says.
    inside = tc.report([reference, (STREAMED_CUT, cut(content=prose)), (CUT_PROBE, cut(content=prose + "\n"))])
    assert inside.cut_in_prose == 0 and inside.cut_check().startswith("2 answer(s) cut inside the call")
