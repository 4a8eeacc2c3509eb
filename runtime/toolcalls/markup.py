"""The DSML vocabulary of DeepSeek V3.2 and V4 tool calls, as it appears in text, whole or marker-stripped.

A call block is `<｜DSML｜function_calls>` (V3.2) or `<｜DSML｜tool_calls>` (V4) around `<｜DSML｜invoke name="…">`
elements. `｜DSML｜` is a special token: decoded with `skip_special_tokens` it vanishes and leaves
`<tool_calls>`, `<invoke name="…">`: the "stripped" form, which no SGLang parser recognises.
"""

from __future__ import annotations

import dataclasses
import enum
import re

DSML = "｜DSML｜"
V32_BLOCK = "function_calls"
V4_BLOCK = "tool_calls"
BLOCKS = (V32_BLOCK, V4_BLOCK)
INVOKE = "invoke"
PARAMETER = "parameter"

# The block name each SGLang tool-call parser expects; another block name is the wrong version's markup.
EXPECTED_BLOCK: dict[str, str] = {"deepseekv32": V32_BLOCK, "deepseekv4": V4_BLOCK}

# Where a leaked region starts. A bare invoke counts (SGLang's V3.2 parser accepts one without its block);
# `name="` is required so that prose mentioning `<invoke` is not taken for markup.
_OPENER = re.compile(r"<(?P<dsml>" + re.escape(DSML) + r")?(?:(?P<block>function_calls|tool_calls)>|invoke name=\")")
OPENERS: tuple[str, ...] = tuple(
    f"<{prefix}{tail}" for prefix in (DSML, "") for tail in (f"{V32_BLOCK}>", f"{V4_BLOCK}>", f'{INVOKE} name="')
)
LONGEST_OPENER = max(len(o) for o in OPENERS)


class Cause(enum.Enum):
    """Why markup reached content, as far as the text and the request tell."""

    PARSER_OFF = "parser-off"  # no tool-call parser ran on this request (none configured, tool_choice "none")
    STRIPPED_MARKERS = "stripped-markers"  # `｜DSML｜` was decoded away (skip_special_tokens in a mixed batch)
    WRONG_VERSION = "wrong-version-markers"  # the other DeepSeek version's block (a mismatched chat template)
    MALFORMED_CALL = "malformed-call"  # the expected markup, which the parser refused (unclosed, bad arguments)
    TRUNCATED_CALL = "truncated-call"  # the output ended inside a call block (max tokens, a stop string, an abort)


@dataclasses.dataclass(frozen=True)
class Opener:
    """The start of a region: whether it carries `｜DSML｜`, and its block name (None: a bare invoke)."""

    dsml: bool
    block: str | None

    @property
    def prefix(self) -> str:
        return DSML if self.dsml else ""

    @property
    def closer(self) -> str:
        return f"</{self.prefix}{self.block or INVOKE}>"


def find_opener(text: str, start: int = 0) -> tuple[int, Opener] | None:
    """The first region opener in `text` at or after `start`: its index and kind."""
    if "<" not in text:
        return None
    match = _OPENER.search(text, start)
    if match is None:
        return None
    return match.start(), Opener(dsml=match.group("dsml") is not None, block=match.group("block"))


def held_suffix(text: str) -> int:
    """Length of the longest suffix of `text` that may still become an opener: what a stream must hold back.

    Openers hold one `<`, at their start, so only the text from the last `<` can be a prefix of one."""
    last = text.rfind("<")
    if last == -1 or len(text) - last >= LONGEST_OPENER:
        return 0
    tail = text[last:]
    return len(tail) if any(o.startswith(tail) for o in OPENERS) else 0


_SELF_CLOSING = {prefix: re.compile(rf'<{re.escape(prefix)}{INVOKE}\s+name="[^"<>]*"\s*/>') for prefix in (DSML, "")}


def region_end(text: str, opener: Opener, start: int = 0) -> int | None:
    """Where the region opened at text[0] ends (exclusive), searching from `start`; None while it is open."""
    if opener.block is None:
        self_closed = _SELF_CLOSING[opener.prefix].match(text)
        if self_closed is not None:
            return self_closed.end()
    at = text.find(opener.closer, max(start, 1))
    return None if at == -1 else at + len(opener.closer)


def classify(opener: Opener, *, parsing_active: bool, expected_block: str | None) -> Cause:
    """The cause of a leaked region, most specific first: what the request did, then what the text shows."""
    if not parsing_active:
        return Cause.PARSER_OFF
    if not opener.dsml:
        return Cause.STRIPPED_MARKERS
    if opener.block is not None and expected_block is not None and opener.block != expected_block:
        return Cause.WRONG_VERSION
    return Cause.MALFORMED_CALL


def contains_markup(text: str) -> bool:
    """Whether `text` holds any DSML marker or stripped opener (a test and canary check)."""
    return DSML in text or find_opener(text) is not None
