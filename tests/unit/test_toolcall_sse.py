"""The guard on SSE chunks (`ChoiceStream.rewrite`): the fast path passes a plain chunk through untouched, and
never a chunk it must look into (a `<`, one escaped as `\\u003c`, held text, a tool-call delta)."""

from __future__ import annotations

import json

from pdfleet.runtime.toolcalls.markup import V32_BLOCK
from pdfleet.runtime.toolcalls.sse import ChoiceStream
from pdfleet.runtime.toolcalls.stream import Context, StreamGuard

CONTEXT = Context(parsing_active=True, expected_block=V32_BLOCK, tools=frozenset({"get_weather"}), salvage=True)
STRIPPED_CALL = ('<function_calls>\n<invoke name="get_weather">\n<parameter name="city" string="true">Paris'
                 '</parameter>\n</invoke>\n</function_calls>')


def _chunk(content: str, *, ensure_ascii: bool = False) -> str:
    payload = {"id": "r", "object": "chat.completion.chunk", "created": 0, "model": "m",
               "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
    text = json.dumps(payload, ensure_ascii=ensure_ascii)
    if ensure_ascii:  # as an HTML-safe encoder writes it
        text = text.replace("<", "\\u003c").replace(">", "\\u003e")
    return f"data: {text}\n\n"


def _delta(chunk: str | None) -> dict[str, object]:
    assert chunk is not None
    return json.loads(chunk[len("data: "):])["choices"][0]["delta"]


def test_a_plain_chunk_comes_back_as_the_same_object() -> None:
    stream = ChoiceStream(StreamGuard(CONTEXT))
    chunk = _chunk("the model answers\n")
    assert stream.rewrite(chunk) is chunk


def test_a_block_with_its_angle_brackets_escaped_is_still_salvaged() -> None:
    stream = ChoiceStream(StreamGuard(CONTEXT))
    delta = _delta(stream.rewrite(_chunk("Sure. " + STRIPPED_CALL, ensure_ascii=True)))
    assert delta["content"] == "Sure. "
    assert [call["function"]["name"] for call in delta["tool_calls"]] == ["get_weather"]  # type: ignore[index]


def test_a_plain_chunk_after_a_held_tail_releases_the_tail() -> None:
    stream = ChoiceStream(StreamGuard(CONTEXT))
    assert _delta(stream.rewrite(_chunk("a <"))) == {"content": "a "}
    assert _delta(stream.rewrite(_chunk(" b, prose"))) == {"content": "< b, prose"}
