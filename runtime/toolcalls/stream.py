"""Finding leaked DSML regions in text that arrives in chunks split anywhere, markers included.

Text outside a region is released as soon as it cannot be the start of a marker: only a possible opener
prefix (at most one `<…` tail) is held back. A region is held until it closes, then salvaged (its calls
returned, its text withheld) or, when salvage is off, released unchanged and only reported. One
`StreamGuard` per choice of a response; a whole text is one `feed` and a `finish`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from pdfleet.runtime.toolcalls.markup import DSML, Cause, Opener, classify, find_opener, held_suffix, region_end
from pdfleet.runtime.toolcalls.salvage import Call, parse_region


@dataclasses.dataclass(frozen=True)
class Context:
    """What the guard knows of the request: whether SGLang parsed its tool calls, which block name that
    parser expects (None: unknown), the tools it may call (none when it declared none or said
    `tool_choice: "none"`: then markup is withheld, never salvaged), and whether to salvage."""

    parsing_active: bool
    expected_block: str | None = None
    tools: Collection[str] = frozenset()
    salvage: bool = False


class Action:
    REPORTED = "reported"  # salvage off: the markup stays in content, counted
    SALVAGED = "salvaged"  # turned into tool_calls
    WITHHELD = "withheld"  # salvage on but not well-formed: removed from content, no call invented


@dataclasses.dataclass(frozen=True)
class Leak:
    cause: Cause
    action: str
    sample: str


@dataclasses.dataclass(slots=True)
class Step:
    """What one feed released: content text, salvaged calls, and the leaks it found."""

    text: str = ""
    calls: list[Call] = dataclasses.field(default_factory=list)
    leaks: list[Leak] = dataclasses.field(default_factory=list)


SAMPLE_CHARS = 200


class StreamGuard:
    def __init__(self, context: Context) -> None:
        self.context = context
        self.held = ""  # text not yet released; empty: a chunk without `<` passes through unchanged
        self._open: Opener | None = None
        self._scanned = 0  # how far the open region was searched for its closer

    def feed(self, text: str) -> Step:
        step = Step()
        if not self.held and "<" not in text:
            step.text = text
            return step
        self.held += text
        while True:
            if self._open is None:
                found = find_opener(self.held)
                if found is None:
                    keep = held_suffix(self.held)
                    cut = len(self.held) - keep
                    step.text += self.held[:cut]
                    self.held = self.held[cut:]
                    return step
                at, self._open = found
                step.text += self.held[:at]
                self.held = self.held[at:]
                self._scanned = 0
            end = region_end(self.held, self._open, self._scanned)
            if end is None:
                self._scanned = max(0, len(self.held) - len(self._open.closer))
                return step
            self._close(self.held[:end], self._open, complete=True, step=step)
            self.held = self.held[end:]
            self._open = None

    def finish(self) -> Step:
        """Releases what is held; an open region is a truncated (malformed) call, and so is a DSML opener the
        output stopped inside (`<｜DSML｜func`: prose never writes the full-width bar; a bare `<` may be prose)."""
        step = Step()
        if self._open is not None:
            self._close(self.held, self._open, complete=False, step=step)
        elif DSML[0] in self.held:
            sample = self.held[:SAMPLE_CHARS]
            withheld = self.context.salvage
            step.text = "" if withheld else self.held
            step.leaks.append(Leak(Cause.TRUNCATED_CALL, Action.WITHHELD if withheld else Action.REPORTED, sample))
        else:
            step.text = self.held
        self.held, self._open = "", None
        return step

    def _close(self, region: str, opener: Opener, *, complete: bool, step: Step) -> None:
        ctx = self.context
        cause = classify(opener, parsing_active=ctx.parsing_active, expected_block=ctx.expected_block)
        sample = region[:SAMPLE_CHARS]
        if not ctx.salvage:
            step.text += region
            step.leaks.append(Leak(cause, Action.REPORTED, sample))
            return
        calls = parse_region(region, opener, ctx.tools) if complete else None
        if calls is None:
            step.leaks.append(Leak(cause, Action.WITHHELD, sample))
            return
        step.calls.extend(calls)
        step.leaks.append(Leak(cause, Action.SALVAGED, sample))


def scan(text: str, context: Context) -> Step:
    """A whole text through a fresh guard."""
    guard = StreamGuard(context)
    step = guard.feed(text)
    rest = guard.finish()
    step.text += rest.text
    step.calls.extend(rest.calls)
    step.leaks.extend(rest.leaks)
    return step
