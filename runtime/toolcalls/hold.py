"""Streamed tool calls held until their arguments are a complete JSON object, so that no fragment of a call the
output later cuts short ever reaches a client.

SGLang streams a call as OpenAI does: a delta naming it (`id`, `function.name`), then argument fragments for
its `index`. deepseek-recipe (V4) sends fragments as the model writes them; a call cut inside its arguments has
then already sent `{"city": "Os` and no later chunk can take it back. Holding each call until its arguments
parse as an object costs its first byte the time the model takes to write the arguments (`make bench`,
docs/toolcalls.md); a client cannot run a call before that anyway. A released call goes out as one delta with
its whole arguments, numbered in release order, so the indices a client sees are 0..n-1 with no gap where a
call was withheld.

Arguments that parse are not enough: recipe writes `{"city": "Paris"}` as soon as the last parameter written so
far closes, and the model may still write another. A call is whole when its invoke closed in the raw output
(`closed`: how many invokes have), as on the non-streamed path and on the text routes, where SGLang's detectors
only send a call then.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pdfleet.runtime.toolcalls.cut import json_object


@dataclasses.dataclass
class _Call:
    id: Any
    name: Any
    arguments: str = ""


class CallHold:
    """The tool-call deltas of one choice. With `hold` off, deltas pass unchanged and are only judged."""

    def __init__(self, *, hold: bool) -> None:
        self.hold = hold
        self.next_index = 0  # the index the next call sent to the client gets
        self._open: dict[int, _Call] = {}  # SGLang's index -> a call not yet released
        self._sent: dict[int, int] = {}  # SGLang's index -> the index the client saw
        self._judged: dict[int, str] = {}  # with hold off: every call's arguments so far

    @property
    def waiting(self) -> bool:
        """Whether a call is held: a later chunk may release it without carrying a call delta itself."""
        return bool(self._open)

    def take(self, deltas: list[dict[str, Any]], closed: int | None = None) -> list[dict[str, Any]]:
        """The deltas to send now for SGLang's `deltas`; `closed`: how many invokes closed in the raw output so
        far (None: not known, the arguments alone decide)."""
        if not self.hold:
            for delta in deltas:
                index = int(delta.get("index") or 0)
                self._judged[index] = self._judged.get(index, "") + _arguments(delta)
                self.next_index = max(self.next_index, index + 1)
            return deltas
        out = []
        for delta in deltas:
            index = int(delta.get("index") or 0)
            if index in self._sent:  # a fragment after the call was whole: SGLang's, passed on as it is
                out.append({**delta, "index": self._sent[index]})
                continue
            call = self._open.setdefault(index, _Call(delta.get("id"), (delta.get("function") or {}).get("name")))
            call.arguments += _arguments(delta)
        return [*out, *self.ripe(closed)]

    def ripe(self, closed: int | None) -> list[dict[str, Any]]:
        """Releases, in SGLang's order, every held call whose invoke closed and whose arguments are an object."""
        out = []
        for index in sorted(self._open):
            call = self._open[index]
            if closed is not None and index >= closed:
                break
            # A complete object ends with `}`: parse only then, so long arguments are not parsed per fragment.
            if not (call.arguments.rstrip().endswith("}") and json_object(call.arguments)):
                break
            out.append(self._release(index, call))
        return out

    def _release(self, index: int, call: _Call) -> dict[str, Any]:
        del self._open[index]
        self._sent[index] = self.next_index
        self.next_index += 1
        return {"id": call.id, "index": self._sent[index], "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}

    @property
    def sent(self) -> int:
        """Calls the client holds whole (with hold off: every call SGLang streamed)."""
        return len(self._sent) if self.hold else len(self._judged)

    def finish(self) -> list[str]:
        """The arguments of every call that never became a JSON object: withheld (hold on) or already sent."""
        if not self.hold:
            return [args for args in self._judged.values() if not json_object(args)]
        broken = [call.arguments for call in self._open.values()]
        self._open.clear()
        return broken


def _arguments(delta: dict[str, Any]) -> str:
    return (delta.get("function") or {}).get("arguments") or ""
