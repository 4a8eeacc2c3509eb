"""The dsml-leak-guard patch on SGLang 0.5.23's real OpenAI chat handler: it verifies and installs, the HTTP
server's class lookup returns the guarded subclass, and leaks SGLang's own V3.2 parser lets through (stripped
markers, tool_choice "none", the V4 block) are counted by cause and, with salvage on, become tool_calls with
a consistent finish reason, streaming and not. Plain text and calls SGLang parsed itself are left alone."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from typing import Any

import pytest

from pdfleet.runtime.patches import base, catalogue, registry, targets
from pdfleet.runtime.patches.impl import dsml_leak_guard as impl
from pdfleet.runtime.toolcalls.markup import DSML, contains_markup
from pdfleet.runtime.toolcalls.report import Reporter
from tests.support import chat_serving
from tests.support.chat_serving import PING_TOOL, WEATHER_TOOL, chat_request, handler, respond, stream

VERSION = "0.5.23"


def calls_block(name: str = "function_calls", *, dsml: bool = True, city: str = "Paris") -> str:
    p = DSML if dsml else ""
    return (f'<{p}{name}>\n<{p}invoke name="get_weather">\n<{p}parameter name="city" string="true">{city}'
            f'</{p}parameter>\n</{p}invoke>\n</{p}{name}>')


STRIPPED = "Let me look.\n\n" + calls_block(dsml=False)


@pytest.fixture
def restore_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-setting each target to itself makes monkeypatch put it back after the test, patched or not."""
    for t in map(targets.resolve, impl.TARGETS):
        monkeypatch.setattr(t.owner, t.attr, inspect.getattr_static(t.owner, t.attr))


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> type:
    return chat_serving.guarded_class(monkeypatch)


def test_catalogue_registry_and_fingerprints_name_the_same_targets() -> None:
    assert catalogue.BY_ID[impl.PATCH_ID].targets == impl.TARGETS
    assert set(impl.FINGERPRINTS[VERSION]) == set(impl.TARGETS)
    assert registry.MODULES[impl.PATCH_ID] == impl.__name__
    assert VERSION in catalogue.BY_ID[impl.PATCH_ID].applies_to


def test_every_target_matches_its_fingerprint_in_the_installed_sglang() -> None:
    for dotted, expected in impl.FINGERPRINTS[VERSION].items():
        assert targets.verify(dotted, expected).function is not None


def test_the_patch_makes_the_http_servers_class_lookup_return_the_guarded_subclass(restore_sglang: None) -> None:
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    applied = base.apply([impl.PATCH_ID], VERSION, registry.implementations([impl.PATCH_ID]))
    assert [a.id for a in applied] == [impl.PATCH_ID]
    manager = object.__new__(TokenizerManager)  # the property reads nothing of the instance
    cls = manager.serving_chat_class
    assert issubclass(cls, OpenAIServingChat) and cls is not OpenAIServingChat
    assert cls is impl.guarded_class(OpenAIServingChat), "one class, not one per lookup"
    assert inspect.getattr_static(TokenizerManager, "serving_chat_class").fget.__pdfleet_patch__ == impl.PATCH_ID
    with pytest.raises(base.PatchError, match="already patched by dsml-leak-guard"):
        base.apply([impl.PATCH_ID], VERSION, registry.implementations([impl.PATCH_ID]))


def test_a_changed_stream_loop_is_refused(restore_sglang: None) -> None:
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    async def _generate_chat_stream(self: Any, adapted_request: Any, request: Any, raw_request: Any) -> Any:
        yield "data: [DONE]\n\n"  # a release whose loop calls _generate_stream_content differently, say

    OpenAIServingChat._generate_chat_stream = _generate_chat_stream  # type: ignore[method-assign]
    with pytest.raises(base.PatchError, match="_generate_chat_stream is not the function"):
        base.apply([impl.PATCH_ID], VERSION, registry.implementations([impl.PATCH_ID]))


def test_salvage_is_read_from_the_engine_environment() -> None:
    assert impl.salvage_enabled({impl.SALVAGE_ENV: "1"}) and impl.salvage_enabled({impl.SALVAGE_ENV: "true"})
    assert not impl.salvage_enabled({}) and not impl.salvage_enabled({impl.SALVAGE_ENV: "0"})


# --- non-streaming ------------------------------------------------------------------------------------------

def test_stripped_markers_are_salvaged_into_tool_calls_with_finish_reason_tool_calls(guarded: type) -> None:
    serving = handler(guarded)
    response = respond(serving, chat_request(tools=[WEATHER_TOOL]), STRIPPED)
    choice = response.choices[0]
    assert choice.message.content == "Let me look.\n\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert choice.finish_reason == "tool_calls"
    assert serving.pdfleet_reporter.counts == {("stripped-markers", "salvaged"): 1}


def test_calls_sglang_parsed_itself_are_left_alone_and_not_counted(guarded: type) -> None:
    serving = handler(guarded)
    response = respond(serving, chat_request(tools=[WEATHER_TOOL]), "Sure.\n\n" + calls_block())
    choice = response.choices[0]
    assert choice.message.content == "Sure."
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    assert choice.finish_reason == "tool_calls" and not serving.pdfleet_reporter.counts


def test_tool_choice_none_markup_is_withheld_and_no_call_is_made(guarded: type) -> None:
    serving = handler(guarded)
    response = respond(serving, chat_request(tools=[WEATHER_TOOL], tool_choice="none"), STRIPPED)
    choice = response.choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (
        "Let me look.\n\n", None, "stop")
    assert serving.pdfleet_reporter.counts == {("parser-off", "withheld"): 1}


def test_with_salvage_off_content_is_unchanged_and_the_leak_counted_and_logged(
        guarded: type, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(impl.SALVAGE_ENV, "0")
    serving = handler(guarded)
    clock = iter([0.0, 10.0, 70.0])
    serving.pdfleet_reporter = Reporter(clock=lambda: next(clock), prometheus=False)
    with caplog.at_level(logging.WARNING, logger="pdfleet.toolcalls"):
        for rid in ("r-1", "r-2", "r-3"):
            response = respond(serving, chat_request(tools=[WEATHER_TOOL]), STRIPPED, rid=rid)
            assert response.choices[0].message.content == STRIPPED
    assert serving.pdfleet_reporter.counts == {("stripped-markers", "reported"): 3}
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2, "one sample a minute"
    assert "r-1" in logged[0] and "stripped-markers" in logged[0] and "r-3" in logged[1]


def test_leaks_reach_the_prometheus_counter() -> None:
    from prometheus_client import REGISTRY

    def value() -> float:
        return REGISTRY.get_sample_value("pdfleet_toolcall_leaks_total",
                                         {"cause": "wrong-version-markers", "action": "reported"}) or 0.0

    before = value()
    reporter = Reporter()
    from pdfleet.runtime.toolcalls.stream import Context, scan
    reporter.record(scan(calls_block("tool_calls"), Context(parsing_active=True,
                                                            expected_block="function_calls")).leaks, "r")
    assert value() == before + 1


# --- streaming ----------------------------------------------------------------------------------------------

def _split(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_streamed_stripped_markers_become_one_tool_call_and_the_finish_reason_says_so(
        guarded: type, size: int) -> None:
    serving = handler(guarded)
    request = chat_request(tools=[WEATHER_TOOL, PING_TOOL], stream=True)
    out = asyncio.run(stream(serving, request, _split(STRIPPED + "\nDone.", size), rid="s-1"))
    assert out["content"] == "Let me look.\n\n\nDone."
    assert [(n, json.loads(a)) for n, a in out["calls"]] == [("get_weather", {"city": "Paris"})]
    assert out["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_streamed_v4_block_through_the_v32_parser_comes_out_without_markup(guarded: type, size: int) -> None:
    serving = handler(guarded)
    request = chat_request(tools=[WEATHER_TOOL], stream=True)
    out = asyncio.run(stream(serving, request, _split("Hi.\n\n" + calls_block("tool_calls"), size), rid="s-2"))
    assert not contains_markup(out["content"]), out
    assert [n for n, _ in out["calls"]] == ["get_weather"]
    assert out["finish_reason"] == "tool_calls"


def test_streamed_plain_text_with_angle_brackets_is_unchanged(guarded: type) -> None:
    serving = handler(guarded)
    text = "Use <b>bold</b>, a < b, and <tool_call> (singular) freely.\n"
    out = asyncio.run(stream(serving, chat_request(tools=[WEATHER_TOOL], stream=True), _split(text, 2), rid="p"))
    assert out == {"content": text, "calls": [], "tool_indices": [], "finish_reason": "stop"}
    assert not serving.pdfleet_reporter.counts
