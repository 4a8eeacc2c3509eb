"""The guard applied to the OpenAI chat stream's SSE chunks (`data: {json}\n\n`), one choice at a time.

Content deltas go through the choice's `StreamGuard`; salvaged calls ride the same chunk as `tool_calls`
deltas, numbered after the calls SGLang's own parser already streamed. SGLang's own call deltas go through the
choice's `CallHold` (whole calls only). A chunk left with nothing to say is dropped. The common case, a chunk
without `<` or a call while nothing is held, passes through unparsed.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pdfleet.runtime.toolcalls.cut import cut_region, leaks
from pdfleet.runtime.toolcalls.hold import CallHold
from pdfleet.runtime.toolcalls.markup import DSML, INVOKE
from pdfleet.runtime.toolcalls.salvage import Call
from pdfleet.runtime.toolcalls.stream import Leak, Step, StreamGuard

_DATA = "data: "
_DATA_OBJECT = _DATA + "{"
_INVOKE_CLOSER = f"</{DSML}{INVOKE}>"  # V3.2's and V4's alike


class ChoiceStream:
    """The guard state of one choice of one streamed response."""

    def __init__(self, guard: StreamGuard) -> None:
        self.guard = guard
        self.calls = CallHold(hold=guard.context.salvage)
        self.salvaged = 0
        self.leaks: list[Leak] = []
        self.output = ""  # the choice's raw output so far, markup and all: where a cut is seen
        self.incremental = False  # whether engine chunks carry only their new text

    def see(self, text: str, *, incremental: bool) -> None:
        """An engine chunk's text: the output so far, or with incremental streaming only what it added."""
        self.output = self.output + text if incremental else text

    @property
    def closed(self) -> int | None:
        """How many invokes closed in the raw output so far (None while SGLang parses no calls)."""
        return self.output.count(_INVOKE_CLOSER) if self.guard.context.parsing_active else None

    def ripe(self, *, chunk_id: str, created: int, model: str, index: int) -> str | None:
        """Held calls whose invoke closed in an engine chunk that made SGLang say nothing, as a chunk of their own
        (None: none)."""
        released = self.calls.ripe(self.closed) if self.calls.waiting else []
        if not released:
            return None
        return _serialised({"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model,
                            "choices": [{"index": index, "delta": {"tool_calls": released}, "finish_reason": None}]})

    def tool_call_deltas(self, calls: list[Call]) -> list[dict[str, Any]]:
        deltas = []
        for call in calls:
            deltas.append({"id": f"call_{uuid.uuid4().hex[:24]}", "index": self.calls.next_index, "type": "function",
                           "function": {"name": call.name, "arguments": call.arguments}})
            self.calls.next_index += 1
        self.salvaged += len(calls)
        return deltas

    def _apply(self, delta: dict[str, Any], step: Step) -> None:
        self.leaks.extend(step.leaks)
        delta["content"] = step.text
        if step.calls:
            delta["tool_calls"] = [*(delta.get("tool_calls") or []), *self.tool_call_deltas(step.calls)]

    def rewrite(self, chunk: str) -> str | None:
        """The chunk with its content guarded and its calls held; None to drop it."""
        # The common chunk (prose, no call, nothing held) is decided by the cheapest tests first, every one a
        # scan of the whole chunk: a single-character search is a memchr, and an escaped `<` needs a backslash.
        calls = '"tool_calls"' in chunk
        if (not calls and "<" not in chunk and not self.guard.held
                and ("\\" not in chunk or "\\u003c" not in chunk)):
            return chunk
        if not chunk.startswith(_DATA_OBJECT):
            return chunk
        payload = json.loads(chunk[len(_DATA):])
        choices = payload.get("choices") or []
        if len(choices) != 1:
            return chunk
        delta = choices[0].get("delta") or {}
        held = calls and self._hold_calls(delta)
        content = delta.get("content")
        if not content:
            if not held:
                return chunk
            return None if not _says_more(payload, choices[0], delta) else _serialised(payload)
        step = self.guard.feed(content)
        if step.text == content and not step.calls and not step.leaks and not held:
            return chunk  # released as it came: no need to serialise it again
        self._apply(delta, step)
        if not delta["content"] and not _says_more(payload, choices[0], delta):
            return None
        return _serialised(payload)

    def _hold_calls(self, delta: dict[str, Any]) -> bool:
        """Passes SGLang's call deltas through the hold; whether the delta changed."""
        deltas = delta.get("tool_calls")
        if not deltas:
            return False
        released = self.calls.take(deltas, self.closed)
        if released is deltas:
            return False
        if released:
            delta["tool_calls"] = released
        else:
            del delta["tool_calls"]
        return True

    def flush(self, *, chunk_id: str, created: int, model: str, index: int) -> str | None:
        """What the guard still holds at the end of the choice, as one chunk (None: nothing)."""
        step = self.guard.finish()
        delta: dict[str, Any] = {}
        self._apply(delta, step)
        if not delta["content"] and "tool_calls" not in delta:
            return None
        payload = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": index, "delta": delta, "finish_reason": None}]}
        return _serialised(payload)

    def settle(self) -> bool:
        """At the end of the choice: counts a cut block or calls with broken arguments (withheld by the hold);
        whether the finish reason may say `tool_calls`."""
        found = cut_region(self.output) if self.guard.context.parsing_active else None
        broken = self.calls.finish()
        self.leaks.extend(leaks(found, broken, salvage=self.guard.context.salvage))
        return found is None and self.calls.sent + self.salvaged > 0

    def take_leaks(self) -> list[Leak]:
        leaks, self.leaks = self.leaks, []
        return leaks


def _says_more(payload: dict[str, Any], choice: dict[str, Any], delta: dict[str, Any]) -> bool:
    return bool(delta.get("tool_calls") or delta.get("role") or delta.get("reasoning_content")
                or choice.get("logprobs") or choice.get("finish_reason") or payload.get("usage"))


def _serialised(payload: dict[str, Any]) -> str:
    return f"{_DATA}{json.dumps(payload, ensure_ascii=False)}\n\n"
