"""How the simulator answers a chat request with tools: as SGLang serving a DeepSeek model that speaks DSML, with
its tool-call parser on (`deepseekv32` unless the engine's `--tool-call-parser` says `deepseekv4`).

A tool request (tools given, `tool_choice` not "none") is answered with one call to the first tool (or the one
`tool_choice` names), its arguments made up from the tool's JSON schema. Healthy, that call comes back
structured (`tool_calls`, finish_reason `tool_calls`). The leak faults make it come back as text in `content`,
each the way one known cause does in SGLang (the canary and the leak guard are tested against them):

    leak-stripped-markers       the call's `｜DSML｜` markers decoded away, only while a plain request is being
                                served alongside (SGLang < 0.5.8 decodes a mixed batch with one request's options)
    leak-parser-off             the whole DSML block, as when no parser ran (tool_choice "none", none configured)
    leak-wrong-version-markers  the other DeepSeek version's block (a chat template of the wrong version)
    leak-malformed-call         the expected block with an argument the parser refuses (an error path's content)

The call is written in `CALL_TOKENS` tokens. A request whose max_tokens ends before that is cut inside its call,
and answered as SGLang with pdfleet's DSML leak guard (salvage on) answers it: the calls complete before the cut
(none: the only call was cut), finish_reason `length`. The `truncated-call` fault answers it as 0.5.23 alone
does on V4's recipe route: the cut call, its arguments as far as they were written (not JSON), `length`.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping
from typing import Any

from pdfleet.runtime.simulator.faults import Fault
from pdfleet.runtime.toolcalls.markup import DSML, EXPECTED_BLOCK, INVOKE, PARAMETER, V4_BLOCK, V32_BLOCK

LEAKS = (Fault.LEAK_STRIPPED_MARKERS, Fault.LEAK_PARSER_OFF, Fault.LEAK_WRONG_VERSION_MARKERS,
         Fault.LEAK_MALFORMED_CALL)
# Few, so that every tool request the tests, the bake's load and the canary's load send (max_tokens 4 and up) gets
# its call whole, as before calls had a length; only a request meant to cut it (the canary's cut check, whose
# max_tokens is half a whole answer's completion tokens) asks for fewer.
CALL_TOKENS = 4


@dataclasses.dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str  # a JSON object's text


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the model said to a tool request: a structured call, or text (the call leaked into content)."""

    call: Call | None
    content: str | None
    cut: bool = False  # max_tokens ended inside the call

    @property
    def finish_reason(self) -> str:
        if self.cut:
            return "length"
        return "tool_calls" if self.call is not None else "stop"


def is_tool_request(body: Mapping[str, Any]) -> bool:
    return bool(body.get("tools")) and body.get("tool_choice") != "none"


def _chosen(body: Mapping[str, Any]) -> dict[str, Any]:
    tools = [t.get("function") or {} for t in body["tools"] if isinstance(t, dict)]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        tools = [t for t in tools if t.get("name") == wanted] or tools
    return tools[0] if tools else {"name": "unknown"}


_VALUES: dict[str, Any] = {"string": "pdfleet", "integer": 1, "number": 1.5, "boolean": True, "array": [],
                           "object": {}}


def _arguments(tool: Mapping[str, Any]) -> dict[str, Any]:
    properties = (tool.get("parameters") or {}).get("properties") or {}
    return {name: _VALUES.get(str((schema or {}).get("type"))) for name, schema in properties.items()}


def _block(name: str, arguments: Mapping[str, Any], *, block: str, dsml: bool, malformed: bool = False) -> str:
    """The call as the model writes it: one invoke in a `block`, with or without the `｜DSML｜` markers."""
    p = DSML if dsml else ""
    params = []
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value)
        params.append(f'<{p}{PARAMETER} name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
                      f"{text}</{p}{PARAMETER}>")
    if malformed:  # a non-string parameter whose value is not JSON: every DeepSeek detector refuses it
        params.append(f'<{p}{PARAMETER} name="{next(iter(arguments), "value")}" string="false">'
                      f"{{unclosed</{p}{PARAMETER}>")
    inner = "\n".join(params)
    return f'<{p}{block}>\n<{p}{INVOKE} name="{name}">\n{inner}\n</{p}{INVOKE}>\n</{p}{block}>'


def answer(body: Mapping[str, Any], *, parser: str | None, fault: Fault, plain_alongside: bool,
           max_tokens: int | None = None) -> Answer:
    """The answer to a tool request under `fault` (`plain_alongside`: a plain request is being served too), cut
    short when `max_tokens` ends inside the call."""
    whole = _whole(body, parser=parser, fault=fault, plain_alongside=plain_alongside)
    if max_tokens is None or max_tokens >= CALL_TOKENS:
        return whole
    return _cut(whole, max_tokens, fault)


def _cut(whole: Answer, tokens: int, fault: Fault) -> Answer:
    """`whole` as far as `tokens` of its `CALL_TOKENS` wrote it."""

    def written(text: str) -> str:
        return text[:len(text) * tokens // CALL_TOKENS]

    if whole.call is None:  # leaked into content: the markup written before the cut
        return Answer(None, written(whole.content or ""), cut=True)
    if fault is Fault.TRUNCATED_CALL:
        return Answer(dataclasses.replace(whole.call, arguments=written(whole.call.arguments)), None, cut=True)
    return Answer(None, None, cut=True)


def _whole(body: Mapping[str, Any], *, parser: str | None, fault: Fault, plain_alongside: bool) -> Answer:
    tool = _chosen(body)
    name = str(tool.get("name") or "unknown")
    arguments = _arguments(tool)
    expected = EXPECTED_BLOCK.get(parser or "", V32_BLOCK)
    if fault is Fault.LEAK_PARSER_OFF:
        return Answer(None, _block(name, arguments, block=expected, dsml=True))
    if fault is Fault.LEAK_WRONG_VERSION_MARKERS:
        other = V32_BLOCK if expected == V4_BLOCK else V4_BLOCK
        return Answer(None, _block(name, arguments, block=other, dsml=True))
    if fault is Fault.LEAK_MALFORMED_CALL:
        return Answer(None, _block(name, arguments, block=expected, dsml=True, malformed=True))
    if fault is Fault.LEAK_STRIPPED_MARKERS and plain_alongside:
        return Answer(None, _block(name, arguments, block=expected, dsml=False))
    return Answer(Call(f"call_{uuid.uuid4().hex[:24]}", name, json.dumps(arguments)), None)


def pieces(text: str, size: int = 8) -> list[str]:
    """Text as streamed: in pieces that split markers anywhere, as a tokenizer's do."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def stream_deltas(ans: Answer) -> list[dict[str, Any]]:
    """The `delta`s SGLang streams for an answer: a call's header, then its arguments in pieces; or the text."""
    if ans.call is None:
        return [{"content": piece} for piece in pieces(ans.content)] if ans.content else []
    call = ans.call
    head = {"tool_calls": [{"index": 0, "id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": ""}}]}
    return [head, *({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                    for piece in pieces(call.arguments))]


def message(ans: Answer) -> dict[str, Any]:
    """The non-streamed `message` of an answer."""
    calls = None if ans.call is None else [{"id": ans.call.id, "index": 0, "type": "function", "function": {
        "name": ans.call.name, "arguments": ans.call.arguments}}]
    return {"role": "assistant", "content": ans.content, "reasoning_content": None, "tool_calls": calls}
