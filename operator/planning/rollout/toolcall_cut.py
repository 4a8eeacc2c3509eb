"""The tool-call canary's cut check, pure: how long its cut probes may write, and what their answers must be.

The contract (docs/toolcalls.md) for an output cut by the request's own `max_tokens` inside a DSML call block:
the calls complete before the cut come back, a call whose arguments are not a JSON object never does, the
finish reason is the engine's (`length`), never `tool_calls`, and the stream's final state is the non-streamed
answer. Each way an answer breaks it is a cause, named as `pdfleet canary` and the toolCallCanary gate say it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pdfleet.runtime.toolcalls.cut import json_object
from pdfleet.runtime.toolcalls.markup import Cause

# The reference answer's budget: room for prose and a whole call on any tokenizer, so that it ends by itself.
REFERENCE_MAX_TOKENS = 256
TRUNCATED_CALL = Cause.TRUNCATED_CALL.value  # the leak guard's name for the same case, as its counter says it
CUT_FINISH = "cut-finish-reason"
STREAM_MISMATCH = "stream-mismatch"
WHAT = {
    TRUNCATED_CALL: "a call cut by max_tokens came back with arguments that are not a JSON object",
    CUT_FINISH: "an answer cut by max_tokens inside its call ended with finish_reason tool_calls, not length",
    STREAM_MISMATCH: "the streamed and non-streamed answers cut at the same max_tokens differ",
}

Calls = Iterable[tuple[str, str]]  # (name, arguments) as the client received them


def budget(reference_tokens: int | None, *, prose: str = "", calls: Calls = ()) -> int | None:
    """The cut probes' `max_tokens`, from the completion tokens of a whole tool answer written greedily (None: the
    answer is too short to cut); `prose` and `calls`: the reference's content and calls, to step over its prose.

    Half of the call block, not "all of it less a few": the canary knows neither the model nor its tokenizer, but
    the block's invoke (its name, then the arguments) spans the middle of the block's tokens on every tokenizer,
    V3.2's or V4's, between an opener and closers of a few tokens each. Less a few tokens lands in those closers,
    after the arguments closed, where nothing can break; half lands in the arguments, where 0.5.23 alone returns a
    broken call. Prose before the block takes its share of the tokens by its share of the characters (the calls
    counted by their name and arguments, a lower bound on the block's text, so the estimate leans late, into the
    block); a cut that still lands in the prose is seen afterwards (`in_prose`). The cut probes are greedy like
    the reference, so they write the same tokens up to the cut."""
    if reference_tokens is None or reference_tokens < 2:
        return None
    text = len(prose.strip())
    block = sum(len(name) + len(arguments) for name, arguments in calls)
    before = reference_tokens * text // (text + block) if text and block else 0
    return before + max(1, (reference_tokens - before) // 2)


def in_prose(cut_content: str, reference_content: str) -> bool:
    """Whether an answer cut short stopped in the reference's prose, before its call block: its content is a
    proper prefix of the reference's. Such an answer tested nothing of the contract."""
    cut, whole = cut_content.rstrip(), reference_content.rstrip()
    return len(cut) < len(whole) and whole.startswith(cut)


def spent(completion_tokens: int | None, max_tokens: int) -> bool:
    """Whether an answer ran out of tokens (a server that reports no usage is taken at its word: it did)."""
    return completion_tokens is None or completion_tokens >= max_tokens


def findings(calls: Calls, finish_reason: str | None) -> list[tuple[str, str]]:
    """Each cause an answer cut inside its call shows, with a sample of it."""
    found = [(TRUNCATED_CALL, f"{name}: {arguments}") for name, arguments in calls if not json_object(arguments)]
    out = found[:1]  # counted once an answer, as the guard counts it
    if finish_reason == "tool_calls":
        out.append((CUT_FINISH, "finish_reason 'tool_calls' on an answer whose tokens ran out"))
    return out


def shape(calls: Calls, finish_reason: str | None) -> tuple[Any, ...]:
    """What a streamed and a non-streamed answer must agree on: the calls, arguments compared as JSON (each path
    formats them its own way), and the finish reason. Not the content: greedy decoding is not bit-exact across
    batches on every engine, and prose that differs by a word is no tool-call fault."""
    return tuple((name, _parsed(arguments)) for name, arguments in calls), finish_reason


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
