"""A strict parser of one leaked DSML region: well-formed calls out, or nothing.

Stricter than SGLang's detectors on purpose: a salvaged call is one the model certainly meant. Anything not
whitespace between the tags, an unknown tool, a parameter without `string=`, a non-JSON value of a
`string="false"` parameter, a repeated parameter or an unclosed element refuses the whole region.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Collection
from functools import cache
from typing import Any

from pdfleet.runtime.toolcalls.markup import DSML, INVOKE, PARAMETER, Opener


@dataclasses.dataclass(frozen=True)
class Call:
    """A salvaged call: the tool's name and its arguments as a JSON object text."""

    name: str
    arguments: str


@cache
def _patterns(prefix: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    p = re.escape(prefix)
    invoke = re.compile(rf'\s*<{p}{INVOKE}\s+name="(?P<name>[^"<>]+)"\s*(?:(?P<empty>/>)|>(?P<body>.*?)</{p}{INVOKE}>)',
                        re.DOTALL)
    parameter = re.compile(
        rf'\s*<{p}{PARAMETER}\s+name="(?P<name>[^"<>]+)"\s+string="(?P<string>true|false)"\s*>'
        rf"(?P<value>.*?)</{p}{PARAMETER}>",
        re.DOTALL,
    )
    return invoke, parameter


def _reject_constant(value: str) -> Any:
    raise ValueError(f"not JSON: {value}")


def _json(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant)


def _arguments(body: str, prefix: str) -> str | None:
    stripped = body.strip()
    if not stripped:
        return "{}"
    if stripped.startswith("{"):
        try:
            value = _json(stripped)
        except ValueError:
            return None
        return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None
    _, parameter = _patterns(prefix)
    params: dict[str, Any] = {}
    pos = 0
    while pos < len(body) and body[pos:].strip():
        match = parameter.match(body, pos)
        if match is None or match["name"] in params:
            return None
        value = match["value"]
        if match["string"] == "true":
            params[match["name"]] = value.strip()  # as SGLang's DeepSeek detectors do
        else:
            try:
                params[match["name"]] = _json(value.strip())
            except ValueError:
                return None
        pos = match.end()
    return json.dumps(params, ensure_ascii=False)


def parse_region(region: str, opener: Opener, tools: Collection[str]) -> list[Call] | None:
    """The calls of a complete region, or None if it is not entirely well-formed calls to `tools` (names)."""
    prefix = opener.prefix
    body = region
    if opener.block is not None:
        head, tail = f"<{prefix}{opener.block}>", f"</{prefix}{opener.block}>"
        if not (body.startswith(head) and body.endswith(tail)):
            return None
        body = body[len(head):-len(tail)]
    if DSML in body and not opener.dsml:
        return None  # stripped and whole markers mixed: not one decoding of one block
    invoke, _ = _patterns(prefix)
    calls: list[Call] = []
    pos = 0
    while pos < len(body) and body[pos:].strip():
        match = invoke.match(body, pos)
        if match is None:
            return None
        name = match["name"].strip()
        if name not in tools:
            return None
        arguments = "{}" if match["empty"] else _arguments(match["body"], prefix)
        if arguments is None:
            return None
        calls.append(Call(name=name, arguments=arguments))
        pos = match.end()
    return calls or None
