"""An output cut short inside a DSML call block (max tokens, a stop string, an abort): one verdict for every path.

SGLang 0.5.23 answers such an output four ways: its text detectors stream each call as its invoke closes but
drop the whole unterminated block when not streaming, and deepseek-recipe (V4's token-id route) returns the
call in progress with arguments that are not JSON, streamed and not. The contract (docs/toolcalls.md): the
calls complete before the cut are returned, a call whose arguments are not a complete JSON object never is,
the answer is counted `truncated-call`, and its finish reason is the engine's (`length` when tokens ran out),
never `tool_calls`.

The cut is read from the raw output text, which carries `｜DSML｜` whole on every route (SGLang decodes tool
requests with special tokens kept). A block whose markers were decoded away is content, the leak guard's
business (`stream`), and is not looked at here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Sequence

from pdfleet.runtime.toolcalls.markup import INVOKE, Cause, Opener, find_opener, region_end
from pdfleet.runtime.toolcalls.salvage import Call, parse_region
from pdfleet.runtime.toolcalls.stream import SAMPLE_CHARS, Action, Leak


@dataclasses.dataclass(frozen=True)
class Cut:
    """The region an output ended inside: its text from the opener to the end, and the opener."""

    region: str
    opener: Opener


def cut_region(text: str) -> Cut | None:
    """The DSML call region `text` ends inside, if it does; regions that close are skipped."""
    at = 0
    while (found := find_opener(text, at)) is not None:
        start, opener = found
        end = region_end(text[start:], opener)
        if end is None:
            return Cut(text[start:], opener) if opener.dsml else None
        at = start + end
    return None


def complete_calls(cut: Cut, tools: Collection[str]) -> list[Call]:
    """The calls whose invoke closed before the cut, parsed strictly (`salvage`); none if any of them is not
    well-formed. A bare invoke cut short holds none."""
    if cut.opener.block is None:
        return []
    prefix = cut.opener.prefix
    last = cut.region.rfind(f"</{prefix}{INVOKE}>")
    if last == -1:
        return []
    closed = cut.region[:last + len(f"</{prefix}{INVOKE}>")] + f"\n</{prefix}{cut.opener.block}>"
    return parse_region(closed, cut.opener, tools) or []


def json_object(arguments: str) -> bool:
    """Whether `arguments` is a complete JSON object: the only arguments a returned call may carry."""
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def leaks(cut: Cut | None, broken: Sequence[str], *, salvage: bool) -> list[Leak]:
    """What to count for one answer: the cut (one per answer), else each call with broken arguments."""
    action = Action.WITHHELD if salvage else Action.REPORTED
    if cut is not None:
        return [Leak(Cause.TRUNCATED_CALL, action, cut.region[:SAMPLE_CHARS])]
    return [Leak(Cause.MALFORMED_CALL, action, arguments[:SAMPLE_CHARS]) for arguments in broken]


def finish_reason(said: str | None, engine: str | None, *, cut: bool, calls: int) -> str | None:
    """The finish reason a client gets: the engine's own when the output was cut or no call is left, since
    `tool_calls` would tell it that the calls it holds are all the model meant."""
    if said == "tool_calls" and (cut or not calls):
        return engine
    return said
