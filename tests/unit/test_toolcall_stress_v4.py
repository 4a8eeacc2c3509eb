"""Stress on DeepSeek V4's real path: 256 concurrent streams through SGLang 0.5.23's OpenAI chat handler with
`--tool-call-parser deepseekv4`, whose output is parsed from token ids by deepseek-recipe (`dsv4` encoding),
with the DSML leak guard: zero markup in content, every call recovered exactly once, plain text unchanged.

The engine's output is token ids (tests/support/recipe_serving's offline byte-level tokenizer with V4's special
tokens), cut into chunks at random; every tool stream is also cut inside its first marker (between `<` and the
`｜DSML｜` token, or inside the bytes of a marker-stripped `<tool_calls>`). Call markup is what recipe's own
encoder writes. Each tool request's output is one of:

    native          V4's block: recipe parses it, the guard sees no markup
    stripped        the block with `｜DSML｜` decoded away (the mixed-batch decode leak): recipe passes it as text,
                    the guard salvages it
    other-version   V3.2's `function_calls` block with whole markers: recipe 0.2.0 keys on the `｜DSML｜` token,
                    not the block name, and parses it as calls
    parser-off      V4's block under `tool_choice: "none"`: recipe does not parse it, the guard withholds it

The same outputs through the handler without the guard show what the guard fixes. Seeded; the seed is in each
failure message.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from pdfleet.runtime.toolcalls.markup import DSML, contains_markup
from tests.support import chat_serving, recipe_serving
from tests.support.chat_serving import PING_TOOL, WEATHER_TOOL, chat_request
from tests.support.recipe_serving import encode, v4_handler, v4_markup, v4_respond, v4_stream

STREAMS = 256
SEED = 20261202
TOOLS = [WEATHER_TOOL, PING_TOOL]
WORDS = ["the", "weather", "a", "<", "b", "<b>bold</b>", "x<y", "tool", "call", "invoke", "</", "|", "｜", "ok",
         "1 < 2", "<tool_call>", "parameters", "\n", "Paris", "naïve", "→", "São"]
KINDS = ("plain", "native", "stripped", "other-version", "parser-off")
CITIES = ["Paris", "Oslo", "São Paulo", "a < b", "x, y", "東京"]


@dataclass
class Case:
    kind: str
    text: str
    prose: str  # the text that is not markup, whitespace-normalised
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    chunks: list[list[int]] = field(default_factory=list)


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).replace(" \n", "\n")


def _random_calls(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    return [("ping", {}) if rng.random() < 0.3 else ("get_weather", {"city": rng.choice(CITIES)})
            for _ in range(rng.randint(1, 3))]


def _chunks(rng: random.Random, text: str, marker_at: int | None, marker: str) -> list[list[int]]:
    """`text`'s ids in random chunks; with `marker_at`, one cut falls strictly inside the marker there."""
    ids = encode(text)
    cuts = {rng.randrange(1, len(ids)) for _ in range(rng.randint(0, len(ids) // 3))} if len(ids) > 1 else set()
    if marker_at is not None:
        start, inner = len(encode(text[:marker_at])), len(encode(marker))
        assert inner > 1 and ids[start:start + inner] == encode(marker), "markers tokenise alone"
        cuts.add(start + rng.randrange(1, inner))
    points = sorted(cuts)
    return [ids[a:b] for a, b in zip([0, *points], [*points, len(ids)], strict=True)]


def make_case(rng: random.Random, kind: str) -> Case:
    before = _prose(rng, rng.randint(0, 12))
    if kind == "plain":
        text = _prose(rng, rng.randint(1, 40)) + rng.choice(["", " ", "<", " <b"])
        return Case(kind, text, text, chunks=_chunks(rng, text, None, ""))
    calls = _random_calls(rng)
    markup = v4_markup(calls, TOOLS)
    if kind == "stripped":
        markup = markup.replace(DSML, "")
    elif kind == "other-version":
        markup = markup.replace(f"{DSML}tool_calls>", f"{DSML}function_calls>")
    # recipe, like SGLang's text parsers (upstream #34214), drops text after calls it parsed: only markup it
    # passes as text gets text after it.
    after = _prose(rng, rng.randint(1, 8)) if kind == "stripped" else ""
    text = f"{before}\n\n{markup}" + (f"\n{after}" if after else "")
    marker = "<tool_calls>" if kind == "stripped" else f"<{DSML}"
    expected = [] if kind == "parser-off" else calls  # the client said no calls: withheld, never made
    return Case(kind, text, " ".join(f"{before} {after}".split()), expected,
                _chunks(rng, text, text.index(marker), marker))


def _cases(seed: int) -> list[Case]:
    rng = random.Random(seed)
    return [make_case(rng, KINDS[n % len(KINDS)]) for n in range(STREAMS)]


def _request(n: int, case: Case, *, stream: bool) -> Any:
    if case.kind == "parser-off":
        return chat_request(tools=TOOLS, tool_choice="none", stream=stream)
    return chat_request(tools=TOOLS if case.kind != "plain" or n % 8 == 0 else [], stream=stream)


def _check(case: Case, out: tuple[str, list[tuple[str, str]], str | None], bare: tuple[str, Any, Any],
           seed: int) -> None:
    """`out` (content, calls, finish reason) is right for `case`; `bare` is what SGLang gave without the guard."""
    content, calls, finish = out
    where = f"seed {seed}, {case.kind} case {case.text!r} in {len(case.chunks)} chunks"
    if case.kind == "plain":
        # recipe drops the newlines an answer opens with (in one chunk or several); the guard changes nothing.
        assert out == bare == (case.text.lstrip("\n"), [], "stop"), where
        return
    assert not contains_markup(content), f"{where}: {content!r}"
    assert [(name, json.loads(args)) for name, args in calls] == case.calls, where
    assert " ".join(content.split()) == case.prose, where
    assert finish == ("tool_calls" if case.calls else "stop"), where


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> type:
    recipe_serving.serving_settings(monkeypatch)
    return chat_serving.guarded_class(monkeypatch)


def _stream_all(serving: Any, cases: list[Case]) -> list[dict[str, Any]]:
    async def run_all() -> list[dict[str, Any]]:
        return await asyncio.gather(*(v4_stream(serving, _request(n, case, stream=True), case.chunks, f"req-{n}")
                                      for n, case in enumerate(cases)))

    return asyncio.run(run_all())


def _streamed(out: dict[str, Any]) -> tuple[str, list[tuple[str, str]], str | None]:
    return out["content"], out["calls"], out["finish_reason"]


def _responded(serving: Any, n: int, case: Case) -> tuple[str, list[tuple[str, str]], str | None]:
    ids = [token for chunk in case.chunks for token in chunk]
    choice = v4_respond(serving, _request(n, case, stream=False), ids, rid=f"req-{n}").choices[0]
    calls = choice.message.tool_calls or []
    assert [c.index for c in calls] == list(range(len(calls))), "tool call indices 0..n-1, each once"
    return choice.message.content or "", [(c.function.name, c.function.arguments) for c in calls], \
        choice.finish_reason


def test_256_concurrent_streams_through_sglangs_v4_recipe_handler_with_the_guard(guarded: type) -> None:
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    cases = _cases(SEED)
    serving = v4_handler(guarded)
    assert type(serving._encoding_output()).__name__ == "DeepSeekRecipeChatEncodingAdapter"
    bare = _stream_all(v4_handler(OpenAIServingChat), cases)
    results = _stream_all(serving, cases)
    for case, out, alone in zip(cases, results, bare, strict=True):
        _check(case, _streamed(out), _streamed(alone), SEED)
        assert out["tool_indices"] == list(range(len(out["calls"]))), "tool call indices 0..n-1, each once"
    kinds = collections.Counter(case.kind for case in cases)
    assert serving.pdfleet_reporter.counts == {("stripped-markers", "salvaged"): kinds["stripped"],
                                               ("parser-off", "withheld"): kinds["parser-off"]}
    # What the guard fixed: without it, every stripped and parser-off stream leaks markup, and nothing else does.
    leaked = collections.Counter(case.kind for case, alone in zip(cases, bare, strict=True)
                                 if contains_markup(alone["content"]))
    assert leaked == {"stripped": kinds["stripped"], "parser-off": kinds["parser-off"]}


def test_the_same_mix_not_streamed_through_sglangs_v4_recipe_handler_with_the_guard(guarded: type) -> None:
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    cases = _cases(SEED + 1)
    serving, alone = v4_handler(guarded), v4_handler(OpenAIServingChat)
    for n, case in enumerate(cases):
        _check(case, _responded(serving, n, case), _responded(alone, n, case), SEED + 1)
    kinds = collections.Counter(case.kind for case in cases)
    assert serving.pdfleet_reporter.counts == {("stripped-markers", "salvaged"): kinds["stripped"],
                                               ("parser-off", "withheld"): kinds["parser-off"]}
