"""Stress: 256 concurrent streams, tool and plain requests mixed, chunked at random (every tool stream also
split inside a marker), through SGLang 0.5.23's own parsers with the DSML leak guard: zero markup in
content, every call recovered exactly once, plain text unchanged.

Two paths: the real OpenAI chat handler (guarded subclass, `--tool-call-parser deepseekv32`: SGLang's
`DeepSeekV32Detector` inside `_generate_chat_stream`), and SGLang's `DeepSeekV4Detector` (V4's text form)
driven directly with the guard on its output. 0.5.23 serves `deepseekv4` itself through deepseek-recipe's
token-id parser: that path is test_toolcall_stress_v4.
Each request's markup is one of: the parser's own (SGLang parses it), marker-stripped
(the mixed-batch decode leak), the other version's block, and on the handler also stripped markup under
`tool_choice: "none"` (withheld, no call). The same mix also goes through the handler's non-streaming path.
Seeded; the seed is in the failure message.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from pdfleet.runtime.toolcalls.markup import DSML, OPENERS, contains_markup
from pdfleet.runtime.toolcalls.stream import Context, StreamGuard
from tests.support import chat_serving
from tests.support.chat_serving import PING_TOOL, WEATHER_TOOL, chat_request, handler, respond, stream

STREAMS = 256
SEED = 20261201
WORDS = ["the", "weather", "a", "<", "b", "<b>bold</b>", "x<y", "tool", "call", "invoke", "</", "|", "｜", "ok",
         "1 < 2", "<tool_call>", "parameters", "\n", "\n\n", "Paris", "naïve", "→"]
KINDS = ("plain", "native", "stripped", "other-version")
# A request with tools and tool_choice "none": SGLang runs no parser and decodes with special tokens skipped.
PARSER_OFF = "parser-off"


@dataclass
class Case:
    kind: str
    text: str
    prose: str  # the text that is not markup, whitespace-normalised
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    chunks: list[str] = field(default_factory=list)


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).replace(" \n", "\n")


def _calls_markup(rng: random.Random, block: str, dsml: bool) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    p = DSML if dsml else ""
    calls: list[tuple[str, dict[str, Any]]] = []
    body = ""
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.3:
            body += f'<{p}invoke name="ping">\n</{p}invoke>\n'
            calls.append(("ping", {}))
            continue
        city = rng.choice(["Paris", "Oslo", "São Paulo", "a < b", "x, y"])
        if rng.random() < 0.5:
            body += (f'<{p}invoke name="get_weather">\n<{p}parameter name="city" string="true">{city}'
                     f'</{p}parameter>\n</{p}invoke>\n')
        else:
            body += f'<{p}invoke name="get_weather">\n{json.dumps({"city": city}, ensure_ascii=False)}\n</{p}invoke>\n'
        calls.append(("get_weather", {"city": city}))
    return f"<{p}{block}>\n{body}</{p}{block}>", calls


def _split(rng: random.Random, text: str, must_cut_in: str | None) -> list[str]:
    cuts = {rng.randrange(1, len(text)) for _ in range(rng.randint(0, max(1, len(text) // 4)))} if len(text) > 1 \
        else set()
    if must_cut_in:  # a split strictly inside the first marker
        at = text.find(must_cut_in)
        cuts.add(at + rng.randrange(1, len(must_cut_in)))
    points = sorted(cuts)
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def make_case(rng: random.Random, kind: str, own_block: str, other_block: str) -> Case:
    before = _prose(rng, rng.randint(0, 12))
    if kind == "plain":
        text = _prose(rng, rng.randint(1, 40)) + rng.choice(["", " ", "\n", "<", " <b"])
        return Case(kind, text, text, chunks=_split(rng, text, None))
    block = other_block if kind == "other-version" else own_block
    stripped = kind in ("stripped", PARSER_OFF)
    markup, calls = _calls_markup(rng, block, dsml=not stripped)
    # SGLang's parsers drop text after a call they parsed (upstream #34214), so only stripped markup, which
    # they pass through as text, gets text after it.
    after = _prose(rng, rng.randint(1, 8)) if stripped else ""
    text = f"{before}\n\n{markup}" + (f"\n{after}" if after else "")
    marker = f"<{block}>" if stripped else DSML
    expected = [] if kind == PARSER_OFF else calls  # the client said no calls: withheld, never made
    return Case(kind, text, " ".join(f"{before} {after}".split()), expected, _split(rng, text, marker))


def _cases(seed: int, own_block: str, other_block: str, kinds: tuple[str, ...] = KINDS) -> list[Case]:
    rng = random.Random(seed)
    return [make_case(rng, kinds[n % len(kinds)], own_block, other_block) for n in range(STREAMS)]


def _request(n: int, case: Case, *, stream: bool) -> Any:
    if case.kind == PARSER_OFF:
        return chat_request(tools=[WEATHER_TOOL, PING_TOOL], tool_choice="none", stream=stream)
    tools = [WEATHER_TOOL, PING_TOOL] if case.kind != "plain" or n % 8 == 0 else []
    return chat_request(tools=tools, stream=stream)


def _check(case: Case, content: str, calls: list[tuple[str, str]], finish: str | None, seed: int) -> None:
    where = f"seed {seed}, {case.kind} case {case.text!r} in {len(case.chunks)} chunks"
    if case.kind == "plain":
        assert (content, calls, finish) == (case.text, [], "stop"), where
        return
    assert not contains_markup(content) and not any(o in content for o in OPENERS), f"{where}: {content!r}"
    assert [(name, json.loads(args)) for name, args in calls] == case.calls, where
    assert " ".join(content.split()) == case.prose, where
    assert finish == ("tool_calls" if case.calls else "stop"), where


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> type:
    return chat_serving.guarded_class(monkeypatch)


class _Interleaving(chat_serving.FakeTokenizerManager):
    """Yields to the event loop between chunks, so that the streams really interleave."""

    async def generate_request(self, adapted: Any, raw_request: Any = None) -> Any:
        async for out in super().generate_request(adapted, raw_request):
            yield out
            await asyncio.sleep(0)


def test_256_concurrent_streams_through_sglangs_v32_handler_with_the_guard(guarded: type) -> None:
    cases = _cases(SEED, "function_calls", "tool_calls", (*KINDS, PARSER_OFF))
    serving = handler(guarded)
    serving.tokenizer_manager.__class__ = _Interleaving

    async def run_all() -> list[dict[str, Any]]:
        return await asyncio.gather(*(stream(serving, _request(n, case, stream=True), case.chunks, rid=f"req-{n}")
                                      for n, case in enumerate(cases)))

    results = asyncio.run(run_all())
    for case, out in zip(cases, results, strict=True):
        _check(case, out["content"], out["calls"], out["finish_reason"], SEED)
        assert out["tool_indices"] == list(range(len(out["calls"]))), "tool call indices 0..n-1, each once"
    # Every stripped block salvaged by the guard; of each V4 block, SGLang's V3.2 parser takes the invokes (as
    # bare ones) and leaves the wrapper, which the guard withholds. Native markup never reaches the guard.
    kinds = collections.Counter(case.kind for case in cases)
    assert serving.pdfleet_reporter.counts == {("stripped-markers", "salvaged"): kinds["stripped"],
                                               ("wrong-version-markers", "withheld"): kinds["other-version"],
                                               ("parser-off", "withheld"): kinds[PARSER_OFF]}


def test_the_same_mix_not_streamed_through_sglangs_v32_handler_with_the_guard(guarded: type) -> None:
    cases = _cases(SEED + 2, "function_calls", "tool_calls", (*KINDS, PARSER_OFF))
    serving = handler(guarded)
    for n, case in enumerate(cases):
        choice = respond(serving, _request(n, case, stream=False), case.text, rid=f"req-{n}").choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        _check(case, choice.message.content, calls, choice.finish_reason, SEED + 2)
        assert [c.index for c in choice.message.tool_calls or []] == list(range(len(calls)))


def test_256_concurrent_streams_through_sglangs_v4_text_detector_with_the_guard() -> None:
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.deepseekv4_detector import DeepSeekV4Detector

    tools = [Tool.model_validate(t) for t in (WEATHER_TOOL, PING_TOOL)]
    context = Context(parsing_active=True, expected_block="tool_calls", tools=frozenset({"get_weather", "ping"}),
                      salvage=True)
    cases = _cases(SEED + 1, "tool_calls", "function_calls")

    async def one(case: Case) -> tuple[str, list[tuple[str, str]]]:
        detector, guard = DeepSeekV4Detector(), StreamGuard(context)
        content, calls = "", []
        for piece in [*case.chunks, None]:
            result = detector.finish(tools) if piece is None else detector.parse_streaming_increment(piece, tools)
            calls += [(c.name, c.parameters) for c in result.calls if c.name]
            steps = [guard.feed(result.normal_text or "")] + ([guard.finish()] if piece is None else [])
            for step in steps:
                content += step.text
                calls += [(c.name, c.arguments) for c in step.calls]
            await asyncio.sleep(0)
        return content, calls

    async def run_all() -> list[tuple[str, list[tuple[str, str]]]]:
        return await asyncio.gather(*(one(case) for case in cases))

    for case, (content, calls) in zip(cases, asyncio.run(run_all()), strict=True):
        _check(case, content, calls, "tool_calls" if calls else "stop", SEED + 1)
