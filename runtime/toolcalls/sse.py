"""The guard applied to the OpenAI chat stream's SSE chunks (`data: {json}\n\n`), one choice at a time.

Content deltas go through the choice's `StreamGuard`; salvaged calls ride the same chunk as `tool_calls`
deltas, numbered after the calls SGLang's own parser already streamed. A chunk left with nothing to say is
dropped. The common case, a chunk without `<` while nothing is held, passes through unparsed.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pdfleet.runtime.toolcalls.salvage import Call
from pdfleet.runtime.toolcalls.stream import Leak, Step, StreamGuard

_DATA = "data: "
_DATA_OBJECT = _DATA + "{"


class ChoiceStream:
    """The guard state of one choice of one streamed response."""

    def __init__(self, guard: StreamGuard) -> None:
        self.guard = guard
        self.next_tool_index = 0
        self.salvaged = 0
        self.leaks: list[Leak] = []

    def tool_call_deltas(self, calls: list[Call]) -> list[dict[str, Any]]:
        deltas = []
        for call in calls:
            deltas.append({"id": f"call_{uuid.uuid4().hex[:24]}", "index": self.next_tool_index, "type": "function",
                           "function": {"name": call.name, "arguments": call.arguments}})
            self.next_tool_index += 1
        self.salvaged += len(calls)
        return deltas

    def _apply(self, delta: dict[str, Any], step: Step) -> None:
        self.leaks.extend(step.leaks)
        delta["content"] = step.text
        if step.calls:
            delta["tool_calls"] = [*(delta.get("tool_calls") or []), *self.tool_call_deltas(step.calls)]

    def rewrite(self, chunk: str) -> str | None:
        """The chunk with its content guarded; None to drop it."""
        if '"tool_calls"' in chunk:
            self.note_tool_calls(chunk)
        if ("<" not in chunk and "\\u003c" not in chunk and self.guard.idle) or not chunk.startswith(_DATA_OBJECT):
            return chunk
        payload = json.loads(chunk[len(_DATA):])
        choices = payload.get("choices") or []
        if len(choices) != 1:
            return chunk
        delta = choices[0].get("delta") or {}
        content = delta.get("content")
        if not content:
            return chunk
        step = self.guard.feed(content)
        if step.text == content and not step.calls and not step.leaks:
            return chunk  # released as it came: no need to serialise it again
        self._apply(delta, step)
        if not delta["content"] and not _says_more(payload, choices[0], delta):
            return None
        return f"{_DATA}{json.dumps(payload, ensure_ascii=False)}\n\n"

    def flush(self, *, chunk_id: str, created: int, model: str, index: int) -> str | None:
        """What the guard still holds at the end of the choice, as one chunk (None: nothing)."""
        step = self.guard.finish()
        delta: dict[str, Any] = {}
        self._apply(delta, step)
        if not delta["content"] and "tool_calls" not in delta:
            return None
        payload = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": index, "delta": delta, "finish_reason": None}]}
        return f"{_DATA}{json.dumps(payload, ensure_ascii=False)}\n\n"

    def take_leaks(self) -> list[Leak]:
        leaks, self.leaks = self.leaks, []
        return leaks

    def note_tool_calls(self, chunk: str) -> None:
        """Keeps salvaged indices after the calls SGLang's parser streamed (chunks the fast path skipped)."""
        if '"tool_calls"' not in chunk or not chunk.startswith(_DATA_OBJECT):
            return
        for choice in json.loads(chunk[len(_DATA):]).get("choices") or []:
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                self.next_tool_index = max(self.next_tool_index, int(call.get("index") or 0) + 1)


def _says_more(payload: dict[str, Any], choice: dict[str, Any], delta: dict[str, Any]) -> bool:
    return bool(delta.get("tool_calls") or delta.get("role") or delta.get("reasoning_content")
                or choice.get("logprobs") or choice.get("finish_reason") or payload.get("usage"))
