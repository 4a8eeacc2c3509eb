"""The tool-call canary (`toolcall_canary.run`, what `pdfleet canary` calls: the real `openai` client, streamed
and not, concurrent) against SGLang 0.5.23's real chat handler served over HTTP on 127.0.0.1, on both DeepSeek
parser paths: V3.2's text detector (`--tool-call-parser deepseekv32`) and V4's token-id parser
(`deepseekv4`: deepseek-recipe through SGLang's serving_deepseek_recipe). The stand-in model behind the handler
(tests/support/chat_http) writes each version's own call markup; a healthy model passes, the mixed-batch leak
(markers stripped) and a server without a tool-call parser fail the canary by name, and pdfleet's DSML leak guard
with salvage on turns both back into structured calls, which the canary then passes and the guard counted. The
stand-in model stops where the request's max_tokens ends, so the canary's cut check cuts it inside its call: V4's
recipe route alone returns the cut call with broken arguments, which fails the canary as `truncated-call`; the
guard withholds it, and the canary passes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from pdfleet.operator.engines import canary_requests
from pdfleet.operator.planning.rollout.toolcall_canary import Report
from pdfleet.runtime.toolcalls.markup import DSML
from tests.support import chat_http, chat_serving

REQUESTS = 32  # half with tools; of each kind half streamed, and tool_choice auto and required in turn
CONCURRENCY = 32
MAX_TOKENS = 512  # the load's: room for the stand-in model's whole call (about 190 tokens on either path)


@dataclasses.dataclass(frozen=True)
class Path:
    engine: Callable[..., Any]
    model: Callable[[], chat_http.Model]
    parser: str


PATHS = {"v3.2-text-detector": Path(chat_http.V32Engine, chat_http.v32_model, "deepseekv32"),
         "v4-recipe-token-ids": Path(chat_http.V4Engine, chat_http.v4_model, "deepseekv4")}


@pytest.fixture(params=list(PATHS))
def path(request: pytest.FixtureRequest) -> Path:
    return PATHS[request.param]


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> type:
    """SGLang's own handler class, with the HTTP path's settings."""
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    chat_http.http_settings(monkeypatch)
    return OpenAIServingChat


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> type:
    """pdfleet's guarded handler class, salvage on, with the HTTP path's settings."""
    cls = chat_serving.guarded_class(monkeypatch, salvage=True)
    chat_http.http_settings(monkeypatch)
    return cls


def handler(cls: type, path: Path, *, leak: bool = False, parser_off: bool = False) -> Any:
    """`cls` over `path`'s engine; `parser_off`: the server started without a tool-call parser."""
    model = path.model()
    model.leak = leak
    serving = chat_http.serving(cls, path.engine(model, None if parser_off else path.parser))
    if path.parser == "deepseekv4" and not parser_off:  # the path under test really is recipe's id parser
        assert type(serving._encoding_output()).__name__ == "DeepSeekRecipeChatEncodingAdapter"
    return serving


def canary(serving: Any, path: Path) -> Report:
    with chat_http.served(serving) as url:
        report = asyncio.run(canary_requests.run(url, requests=REQUESTS, concurrency=CONCURRENCY,
                                                 parser=path.parser, max_tokens=MAX_TOKENS))
    assert (report.requests - report.cut_requests, report.tool_requests, report.errors) == (REQUESTS, REQUESTS // 2,
                                                                                            {}), report.to_json()
    assert serving.tokenizer_manager.peak > 1, "requests were generated together"
    return report


def passed_with_every_call_structured(report: Report) -> None:
    assert report.passed, report.to_json()
    assert report.structured_calls == report.answered_with_calls == report.tool_requests, report.to_json()


def counted(serving: Any) -> dict[tuple[str, str], int]:
    return dict(serving.pdfleet_reporter.counts)


def test_a_healthy_model_passes_with_the_guard_its_cut_answers_withheld(path: Path, guarded: type) -> None:
    serving = handler(guarded, path)
    report = canary(serving, path)
    passed_with_every_call_structured(report)
    assert (report.cut_requests, report.cut_not_sent) == (2, None), report.to_json()
    # The cut landed inside the call block: the guard saw both cut answers, and only those.
    assert counted(serving) == {("truncated-call", "withheld"): 2}


UNGUARDED_CUT = {"deepseekv32": {}, "deepseekv4": {"truncated-call": 2}}  # by path: V3.2's text, V4's recipe


def test_without_the_guard_a_call_cut_by_max_tokens_fails_the_canary_by_name_on_v4s_recipe_route(
        path: Path, plain: type) -> None:
    """0.5.23 alone: V4's recipe route returns the cut call with the arguments written so far, streamed and not;
    V3.2's text detector drops a block cut inside its only call, which is what the contract asks of it."""
    report = canary(handler(plain, path), path)
    assert report.cut_requests == 2 and report.structured_calls == report.tool_requests, report.to_json()
    assert dict(report.cut) == UNGUARDED_CUT[path.parser], report.to_json()
    if report.cut:
        assert report.failures() == ["a call cut by max_tokens came back with arguments that are not a JSON object "
                                     "(truncated-call) in 2 answer(s)"]
        assert report.samples["truncated-call"] == 'get_weather: {"city": "pdfleet</', "as far as it was written"
    else:
        assert report.passed, report.to_json()


def test_stripped_markers_fail_the_canary_by_name(path: Path, plain: type) -> None:
    report = canary(handler(plain, path, leak=True), path)
    assert report.cut_not_sent == "the reference tool request was answered without tool_calls"
    assert not report.passed
    assert report.leaks == {"stripped-markers": report.tool_requests}, report.to_json()
    assert report.structured_calls == 0
    assert report.failures() == [f"DSML markup in content (stripped-markers) in {report.tool_requests} answer(s)"]
    sample = report.samples["stripped-markers"]
    assert 'invoke name="' in sample and DSML not in sample, sample


def test_the_guard_salvages_stripped_markers_and_the_canary_passes(path: Path, guarded: type) -> None:
    serving = handler(guarded, path, leak=True)
    report = canary(serving, path)
    passed_with_every_call_structured(report)
    # The cut answers' markup, stripped too, is in content, where the guard withholds a block that does not close.
    assert counted(serving) == {("stripped-markers", "salvaged"): report.tool_requests,
                                ("stripped-markers", "withheld"): 2}


def test_a_server_without_a_tool_call_parser_fails_the_canary_unless_guarded(
        path: Path, plain: type, guarded: type) -> None:
    report = canary(handler(plain, path, parser_off=True), path)
    assert report.leaks == {"parser-off": report.tool_requests} and not report.passed, report.to_json()
    assert report.failures() == [f"DSML markup in content (parser-off) in {report.tool_requests} answer(s)"]

    serving = handler(guarded, path, parser_off=True)
    passed_with_every_call_structured(canary(serving, path))
    assert counted(serving) == {("parser-off", "salvaged"): report.tool_requests, ("parser-off", "withheld"): 2}
