"""Model outputs cut short inside a DeepSeek DSML call block, served by SGLang 0.5.23's real chat handler on
every DeepSeek parser route, streamed and not.

An output is prose, then a block of two calls (each version's own encoder writes it), cut at one of `CUTS` by
the engine's finish: tokens ran out (`length`), a stop string of the request matched (`stop`), or the request
was aborted without an error status (`abort`). The routes:

    v32-text     `--tool-call-parser deepseekv32`: SGLang's text detector over the decoded text
    v4-text      `--tool-call-parser deepseekv4` without a tokenizer (`--skip-tokenizer-init`): SGLang's
                 DeepSeekV4Detector over the text
    v4-recipe    `--tool-call-parser deepseekv4` with the model's tokenizer (production): deepseek-recipe's
                 parser over the token ids (tests/support/recipe_serving's offline V4 tokenizer)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.support import chat_serving, recipe_serving
from tests.support.chat_serving import PING_TOOL, WEATHER_TOOL, chat_request

TOOLS = [WEATHER_TOOL, PING_TOOL]
PROSE = "Let me check both cities.\n\n"
CALLS: list[tuple[str, dict[str, Any]]] = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
STOP_STRING = "####"  # a stop string of the request, matched where the output is cut

# Where the output ends, and the calls complete before that point.
CUTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "between-calls": CALLS[:1],  # after the first call's closer
    "inside-arguments": CALLS[:1],  # inside the second call's parameter value
    "inside-invoke-opener": CALLS[:1],  # inside the second call's `<｜DSML｜invoke name="…">`
    "inside-first-arguments": [],  # inside the first call's parameter value: no call is complete
}
FINISHES = ("length", "stop", "abort")


@dataclasses.dataclass(frozen=True)
class Route:
    parser: str
    recipe: bool  # token ids through deepseek-recipe, else the text detector

    def markup(self) -> str:
        if self.parser == "deepseekv32":
            return chat_serving.v32_markup(CALLS)
        return recipe_serving.v4_markup(CALLS, TOOLS)


ROUTES = {"v32-text": Route("deepseekv32", recipe=False), "v4-text": Route("deepseekv4", recipe=False),
          "v4-recipe": Route("deepseekv4", recipe=True)}


def cut_output(route: Route, cut: str) -> str:
    """The text the model wrote before `cut`: the prose and the block up to the cut."""
    markup = route.markup()
    second = markup.index("invoke name=", markup.index("invoke>"))  # the second call's opener
    at = {"between-calls": markup.rindex("\n", 0, second) + 1,
          "inside-arguments": markup.index("Oslo") + 2,
          "inside-invoke-opener": second + len("invoke na"),
          "inside-first-arguments": markup.index("Paris") + 3}[cut]
    return PROSE + markup[:at]


def engine_finish(finish: str, output: str) -> dict[str, Any]:
    """The engine's finish reason for an output cut by `finish`."""
    if finish == "length":
        return {"type": "length", "length": len(output)}
    if finish == "stop":
        return {"type": "stop", "matched": STOP_STRING}
    return {"type": "abort", "message": "aborted"}  # graceful: no status_code, the stream ends normally


def request(finish: str, *, stream: bool) -> Any:
    fields: dict[str, Any] = {"stop": [STOP_STRING]} if finish == "stop" else {}
    return chat_request(tools=TOOLS, stream=stream, **fields)


def handler(cls: type, route: Route) -> Any:
    """`cls` over `route`; its settings (`recipe_serving.serving_settings`) are set first."""
    if route.recipe:
        serving = recipe_serving.v4_handler(cls)
        assert type(serving._encoding_output()).__name__ == "DeepSeekRecipeChatEncodingAdapter"
        return serving
    # Without a tokenizer (--skip-tokenizer-init) SGLang builds no recipe adapter: V4's text detector parses.
    serving = chat_serving.handler(cls, route.parser, tokenizer=route.parser == "deepseekv32")
    assert serving._encoding_output() is None
    return serving


def _ids(output: str, finish: str) -> list[int]:
    # The engine's ids hold a matched stop string (recipe cuts it); its text does not (the detokenizer trims it).
    return recipe_serving.encode(output + (STOP_STRING if finish == "stop" else ""))


Answer = tuple[str, list[tuple[str, str]], str | None]


async def streamed(serving: Any, route: Route, output: str, finish: str, rid: str, *, piece: int = 5) -> Answer:
    """What a client assembles from the stream of `output` cut by `finish`, in engine chunks of `piece`."""
    req = request(finish, stream=True)
    reason = engine_finish(finish, output)
    if route.recipe:
        ids = _ids(output, finish)
        out = await recipe_serving.v4_stream(serving, req, [ids[n:n + piece] for n in range(0, len(ids), piece)],
                                             rid, reason)
    else:
        chunks = [output[n:n + piece] for n in range(0, len(output), piece)]
        out = await chat_serving.stream(serving, req, chunks, rid, reason)
    return out["content"], list(out["calls"]), out["finish_reason"]


def answered(serving: Any, route: Route, output: str, finish: str, rid: str) -> Answer:
    """The non-streamed answer to `output` cut by `finish`."""
    req = request(finish, stream=False)
    reason = engine_finish(finish, output)
    if route.recipe:
        response = recipe_serving.v4_respond(serving, req, _ids(output, finish), rid, reason)
    else:
        response = chat_serving.respond(serving, req, output, rid, reason)
    choice = response.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.message.content or "", calls, choice.finish_reason



# The corpus: one output, cut at every point of its block. Its calls hold a string and a JSON (integer) parameter,
# then a call without parameters, so that cuts land inside markers, names, string values, JSON values, between
# calls and inside the block's closer.
CORPUS_CALLS: list[tuple[str, dict[str, Any]]] = [("get_weather", {"city": "Paris", "days": 3}), ("ping", {})]
INVOKE_CLOSER = "</｜DSML｜invoke>"


@dataclasses.dataclass(frozen=True)
class CutPoint:
    """One cut of the corpus: the engine's output up to it (text, and token ids on the recipe route), and the
    calls whose invoke closed before it."""

    at: int  # characters (text routes) or tokens (recipe) into the block
    text: str
    ids: tuple[int, ...] | None
    complete: list[tuple[str, dict[str, Any]]]


def corpus(route: Route) -> list[CutPoint]:
    """Every cut of the corpus output inside its block: each character of it on a text route, each token on the
    recipe route (a model emits whole tokens, so a cut never splits one there)."""
    markup = chat_serving.v32_markup(CORPUS_CALLS) if route.parser == "deepseekv32" else \
        recipe_serving.v4_markup(CORPUS_CALLS, TOOLS)
    whole = PROSE + markup
    if not route.recipe:
        return [CutPoint(at, whole[:len(PROSE) + at], None, _complete(whole[:len(PROSE) + at]))
                for at in range(1, len(markup))]
    ids = recipe_serving.encode(whole)
    start = len(recipe_serving.encode(PROSE))
    decode = recipe_serving.v4_tokenizer().decode
    points = []
    for end in range(start + 1, len(ids)):
        text = decode(ids[:end])
        points.append(CutPoint(end - start, text, tuple(ids[:end]), _complete(text)))
    return points


def _complete(text: str) -> list[tuple[str, dict[str, Any]]]:
    return CORPUS_CALLS[:text.count(INVOKE_CLOSER)]


async def corpus_answers(serving: Any, route: Route, point: CutPoint) -> tuple[Answer, Answer]:
    """The streamed and non-streamed answers to the corpus output cut at `point`, its tokens run out."""
    finish = engine_finish("length", point.text)
    if route.recipe:
        assert point.ids is not None
        streamed_out = await recipe_serving.v4_stream(serving, request("length", stream=True),
                                                      [point.ids[n:n + 3] for n in range(0, len(point.ids), 3)],
                                                      f"s{point.at}", finish)
        response = recipe_serving.v4_respond(serving, request("length", stream=False), point.ids, f"n{point.at}",
                                             finish)
    else:
        chunks = [point.text[n:n + 5] for n in range(0, len(point.text), 5)]
        streamed_out = await chat_serving.stream(serving, request("length", stream=True), chunks, f"s{point.at}",
                                                 finish)
        response = chat_serving.respond(serving, request("length", stream=False), point.text, f"n{point.at}",
                                        finish)
    choice = response.choices[0]
    answered = (choice.message.content or "", [(c.function.name, c.function.arguments)
                                               for c in choice.message.tool_calls or []], choice.finish_reason)
    return (streamed_out["content"], list(streamed_out["calls"]), streamed_out["finish_reason"]), answered
