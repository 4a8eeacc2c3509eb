"""Outputs cut short inside a DSML call block, through SGLang 0.5.23's real chat handler on every DeepSeek route
(V3.2's text detector, V4's text detector, V4's deepseek-recipe token-id parser), streamed and not, cut between
two calls, inside a call's arguments, inside an invoke opener and inside the first call, by `length`, a stop
string and an abort (tests/support/cut_calls). With the guard (salvage on) every case answers the contract of
docs/toolcalls.md: the calls complete before the cut, none with arguments that are not a JSON object, the prose
kept, the engine's finish reason, one `truncated-call` count; and the stream's final state is the non-streamed
answer. Without it, SGLang answers the same output differently streamed and not, or with a broken call.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest

from pdfleet.runtime.toolcalls.cut import json_object
from pdfleet.runtime.toolcalls.markup import contains_markup
from tests.support import chat_serving, cut_calls, recipe_serving
from tests.support.cut_calls import CUTS, FINISHES, PROSE, ROUTES, Answer, cut_output

CASES = list(itertools.product(ROUTES, CUTS, FINISHES))


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> type:
    cls = chat_serving.guarded_class(monkeypatch, salvage=True)
    recipe_serving.serving_settings(monkeypatch)
    return cls


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> type:
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    recipe_serving.serving_settings(monkeypatch)
    return OpenAIServingChat


def both(cls: type, route: str, cut: str, finish: str) -> tuple[Any, Answer, Answer]:
    """The handler, and its streamed and non-streamed answers to the same cut output."""
    serving = cut_calls.handler(cls, ROUTES[route])
    output = cut_output(ROUTES[route], cut)
    streamed = asyncio.run(cut_calls.streamed(serving, ROUTES[route], output, finish, "req-s"))
    return serving, streamed, cut_calls.answered(serving, ROUTES[route], output, finish, "req-n")


def parsed(answer: Answer) -> tuple[str, list[tuple[str, Any]], str | None]:
    """An answer with each call's arguments parsed: the two paths format JSON each their own way."""
    content, calls, finish = answer
    return content, [(name, json.loads(args)) for name, args in calls], finish


@pytest.mark.parametrize(("route", "cut", "finish"), CASES)
def test_a_cut_block_answers_one_contract_streamed_or_not(guarded: type, route: str, cut: str, finish: str) -> None:
    serving, streamed, answered = both(guarded, route, cut, finish)
    for answer in (streamed, answered):
        content, calls, _ = answer
        assert all(json_object(args) for _, args in calls), f"a call with broken arguments: {calls}"
        assert parsed(answer) == (content, CUTS[cut], finish), answer
        assert content.strip() == PROSE.strip() and not contains_markup(content), content
    assert parsed(streamed) == parsed(answered), "the stream's final state is the non-streamed answer"
    assert serving.pdfleet_reporter.counts == {("truncated-call", "withheld"): 2}, "one count per answer"


def test_without_the_guard_sglang_answers_a_cut_block_three_ways(plain: type) -> None:
    """What the guard fixes, as 0.5.23 answers: its text detectors stream the first call and then drop it when
    not streaming, recipe returns the cut call with arguments that are not JSON, and a stop string inside the
    block ends a stream (text) or both answers (recipe) with `tool_calls`."""
    paris = ("get_weather", '{"city": "Paris"}')
    for route in ("v32-text", "v4-text"):
        _, streamed, answered = both(plain, route, "inside-arguments", "stop")
        assert streamed[1:] == ([paris], "tool_calls") and answered[1:] == ([], "stop"), route
    _, streamed, answered = both(plain, "v4-recipe", "inside-arguments", "length")
    assert streamed[1:] == answered[1:] == ([paris, ("get_weather", '{"city": "Os')], "length")


def test_a_whole_block_is_untouched_and_uncounted(guarded: type) -> None:
    for name, route in ROUTES.items():
        serving = cut_calls.handler(guarded, route)
        output = PROSE + route.markup()
        streamed = asyncio.run(cut_calls.streamed(serving, route, output, "stop", "req-s"))
        answered = cut_calls.answered(serving, route, output, "stop", "req-n")
        assert parsed(streamed) == parsed(answered), name
        assert parsed(answered)[1:] == (cut_calls.CALLS, "tool_calls"), name
        assert not serving.pdfleet_reporter.counts, name


def test_recipe_arguments_are_held_until_the_call_is_whole(guarded: type) -> None:
    """On V4's recipe route SGLang streams a call's arguments as they are written; through the guard a call goes
    out once, whole, in the chunk where its arguments close, numbered 0..n-1."""
    route = ROUTES["v4-recipe"]
    serving = cut_calls.handler(guarded, route)
    ids = recipe_serving.encode(PROSE + route.markup())
    serving.tokenizer_manager.id_chunks["r"] = [[token] for token in ids]
    serving.tokenizer_manager.outputs["r"] = []
    deltas = asyncio.run(_tool_call_deltas(serving, cut_calls.request("stop", stream=True)))
    assert [(d["index"], d["function"]["name"], json.loads(d["function"]["arguments"])) for d in deltas] == \
        [(n, name, args) for n, (name, args) in enumerate(cut_calls.CALLS)]
    assert all(d["id"] for d in deltas)


async def _tool_call_deltas(serving: Any, request: Any) -> list[dict[str, Any]]:
    from types import SimpleNamespace

    deltas = []
    async for event in serving._generate_chat_stream(SimpleNamespace(rid="r"), request, None):
        if event.startswith("data: {"):
            for choice in json.loads(event[len("data: "):]).get("choices") or []:
                deltas += (choice.get("delta") or {}).get("tool_calls") or []
    return deltas


def test_with_salvage_off_a_cut_block_is_counted_and_the_answer_left_as_sglang_gives_it(
        monkeypatch: pytest.MonkeyPatch, plain: type) -> None:
    cls = chat_serving.guarded_class(monkeypatch, salvage=False)
    recipe_serving.serving_settings(monkeypatch)
    for route in ROUTES:
        serving, streamed, answered = both(cls, route, "inside-arguments", "length")
        assert (streamed, answered) == both(plain, route, "inside-arguments", "length")[1:], route
        assert serving.pdfleet_reporter.counts == {("truncated-call", "reported"): 2}, route


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_cut_point_of_a_block_answers_the_contract(guarded: type, route: str) -> None:
    """The generated corpus: one output with a string and a JSON parameter and a call without any, cut by its
    tokens running out at every character (text routes) or token (recipe) of its block."""
    serving = cut_calls.handler(guarded, ROUTES[route])
    points = cut_calls.corpus(ROUTES[route])
    broken: list[str] = []

    async def walk() -> None:
        for point in points:
            streamed, answered = await cut_calls.corpus_answers(serving, ROUTES[route], point)
            for path, answer in (("streamed", streamed), ("not streamed", answered)):
                content, calls, _ = answer
                if not all(json_object(args) for _, args in calls):
                    broken.append(f"{point.at} {path}: arguments not JSON {calls}")
                elif parsed(answer)[1:] != (point.complete, "length"):
                    broken.append(f"{point.at} {path}: {parsed(answer)[1:]} for {point.complete}")
                # A bare `<` may be prose; `<｜…` never is, and a DSML opener cut short is withheld.
                if content.strip() not in (PROSE.strip(), PROSE.strip() + "\n\n<") or contains_markup(content):
                    broken.append(f"{point.at} {path}: content {content!r}")
            # Equal but for whitespace at the content's end: cut right after `<｜DSML｜`, SGLang's streaming
            # detector keeps the blank line before it held, its non-streaming one gives it back.
            if not broken and _trimmed(streamed) != _trimmed(answered):
                broken.append(f"{point.at}: streamed {streamed} but not streamed {answered}")

    asyncio.run(walk())
    assert len(points) > 100, "every character or token of the block is a cut point"
    assert not broken, f"{len(broken)} of {len(points)} cut points broke the contract, first: {broken[:5]}"


def _trimmed(answer: Answer) -> tuple[str, list[tuple[str, Any]], str | None]:
    content, calls, finish = parsed(answer)
    return content.rstrip(), calls, finish
