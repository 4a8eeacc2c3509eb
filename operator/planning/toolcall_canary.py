"""The tool-call canary's plan and verdict, pure: which requests it sends, and what their answers say.

Tool requests (two tools, `tool_choice` "auto" or "required") are interleaved with plain ones, streamed and
not, so that tool requests share batches with plain ones (where SGLang < 0.5.8 strips DSML markers). An
answer passes when a tool request got structured `tool_calls` (valid calls to a declared tool) and no answer
holds DSML markup in its content. Markup is found and its cause named by the runtime's leak guard
(`pdfleet.runtime.toolcalls`), as seen from the client: a well-formed block of the expected version in content
means no parser ran (parser-off); one the strict parser refuses is a malformed call.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from pdfleet.runtime.toolcalls.markup import EXPECTED_BLOCK, Cause, contains_markup
from pdfleet.runtime.toolcalls.stream import Action, Context, scan

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
]
TOOL_NAMES = frozenset(t["function"]["name"] for t in TOOLS)
_REQUIRED = {t["function"]["name"]: set(t["function"]["parameters"]["required"]) for t in TOOLS}
TOOL_PROMPT = "What is the weather in Paris tomorrow? Use a tool."
PLAIN_PROMPT = "Write one sentence about the sea."
SAMPLE_CHARS = 160
DEFAULT_REQUESTS = 64
DEFAULT_CONCURRENCY = 16


@dataclasses.dataclass(frozen=True)
class Probe:
    """One canary request: with tools (`tool_choice` set) or plain (None), streamed or not."""

    index: int
    tool_choice: str | None
    stream: bool

    @property
    def tools(self) -> bool:
        return self.tool_choice is not None


def plan(requests: int) -> list[Probe]:
    """Tool and plain requests alternating, each kind streamed and not in turn, `tool_choice` auto and required."""
    probes = []
    for i in range(requests):
        tools = i % 2 == 0
        choice = ("auto" if (i // 4) % 2 == 0 else "required") if tools else None
        probes.append(Probe(i, choice, stream=(i // 2) % 2 == 0))
    return probes


def plain(requests: int) -> list[Probe]:
    """Plain chat requests only, streamed and not in turn."""
    return [Probe(i, None, stream=i % 2 == 0) for i in range(requests)]


def body(probe: Probe, *, model: str, max_tokens: int) -> dict[str, Any]:
    """The `chat.completions.create` keyword arguments of a probe."""
    prompt = TOOL_PROMPT if probe.tools else PLAIN_PROMPT
    # max_completion_tokens, not max_tokens: OpenAI's and SGLang's (0.5.x) current name; max_tokens is deprecated.
    kwargs: dict[str, Any] = {"model": model, "max_completion_tokens": max_tokens, "stream": probe.stream,
                              "messages": [{"role": "user", "content": prompt}]}
    if probe.tools:
        kwargs.update(tools=TOOLS, tool_choice=probe.tool_choice)
    return kwargs


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str


@dataclasses.dataclass(frozen=True)
class Answer:
    """What came back for a probe: the content, the structured calls, the finish reason; or an error."""

    content: str = ""
    calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    leaks: tuple[Cause, ...] = ()
    malformed: tuple[str, ...] = ()  # why each structured call is not a valid call
    unanswered: bool = False  # a tool request without structured calls (and no leak to explain it)
    error: str | None = None
    sample: str = ""

    @property
    def ok(self) -> bool:
        return not (self.leaks or self.malformed or self.unanswered or self.error)


def _malformed(call: ToolCall) -> str | None:
    if call.name not in TOOL_NAMES:
        return f"call to undeclared tool {call.name!r}"
    try:
        arguments = json.loads(call.arguments or "")
    except ValueError:
        return f"{call.name}: arguments are not JSON: {call.arguments[:SAMPLE_CHARS]!r}"
    if not isinstance(arguments, dict):
        return f"{call.name}: arguments are not a JSON object"
    missing = sorted(_REQUIRED[call.name] - arguments.keys())
    return f"{call.name}: required argument(s) missing: {', '.join(missing)}" if missing else None


def leaks(content: str, *, tools: bool, parser: str | None) -> list[Cause]:
    """The causes of the DSML markup in `content`, one per leaked region (the guard's detection)."""
    if not contains_markup(content):
        return []
    # Salvage on only to learn which regions are well-formed: a well-formed block of the expected markers in
    # content is one no parser ran on.
    context = Context(parsing_active=tools, expected_block=EXPECTED_BLOCK.get(parser or ""),
                      tools=TOOL_NAMES, salvage=True)
    found = [Cause.PARSER_OFF if leak.cause is Cause.MALFORMED_CALL and leak.action == Action.SALVAGED
             else leak.cause for leak in scan(content, context).leaks]
    return found or [Cause.MALFORMED_CALL]  # a marker outside any call block


def judge(probe: Probe, answer: Answer, *, parser: str | None = None) -> Verdict:
    if answer.error is not None:
        return Verdict(error=answer.error)
    causes = tuple(leaks(answer.content, tools=probe.tools, parser=parser))
    malformed = tuple(m for m in map(_malformed, answer.calls) if m)
    unanswered = probe.tools and not answer.calls and not causes
    sample = answer.content[:SAMPLE_CHARS] if causes else ""
    return Verdict(causes, malformed, unanswered, None, sample)


@dataclasses.dataclass
class Report:
    """The canary's findings over all its requests; `passed` is its verdict, `failures` says why not."""

    model: str = ""
    requests: int = 0
    tool_requests: int = 0
    plain_requests: int = 0
    structured_calls: int = 0
    answered_with_calls: int = 0
    leaks: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    malformed: int = 0
    unanswered: int = 0
    errors: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    samples: dict[str, str] = dataclasses.field(default_factory=dict)  # one per leak cause, and per malformation
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.requests > 0 and not (self.leaks or self.malformed or self.unanswered or self.errors)

    def tool_call_failures(self) -> list[str]:
        """What the answers showed wrong with tool calls, most telling first (errors left out)."""
        out = [f"DSML markup in content ({cause}) in {n} answer(s)" for cause, n in self.leaks.most_common()]
        if self.malformed:
            out.append(f"{self.malformed} malformed structured tool call(s)")
        if self.unanswered:
            out.append(f"{self.unanswered} tool request(s) answered without tool_calls")
        return out

    def failures(self) -> list[str]:
        """Each reason the canary failed, most telling first."""
        out = self.tool_call_failures()
        out += [f"{n} request(s) failed: {error}" for error, n in self.errors.most_common()]
        if not self.requests:
            out.append("no request was sent")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "model": self.model, "requests": self.requests,
                "toolRequests": self.tool_requests,
                "plainRequests": self.plain_requests, "structuredCalls": self.structured_calls,
                "answeredWithCalls": self.answered_with_calls, "leaks": dict(self.leaks),
                "malformedCalls": self.malformed, "unanswered": self.unanswered, "errors": dict(self.errors),
                "samples": self.samples, "failures": self.failures(), "durationSeconds": round(self.duration_s, 3)}


def report(results: Iterable[tuple[Probe, Answer]], *, parser: str | None = None,
           duration_s: float = 0.0) -> Report:
    out = Report(duration_s=duration_s)
    for probe, answer in results:
        out.requests += 1
        out.tool_requests += probe.tools
        out.plain_requests += not probe.tools
        verdict = judge(probe, answer, parser=parser)
        if verdict.error is not None:
            out.errors[verdict.error] += 1
            continue
        out.structured_calls += len(answer.calls)
        out.answered_with_calls += bool(answer.calls)
        for cause in verdict.leaks:
            out.leaks[cause.value] += 1
            out.samples.setdefault(cause.value, verdict.sample)
        out.malformed += bool(verdict.malformed)
        if verdict.malformed:
            out.samples.setdefault("malformed", verdict.malformed[0])
        out.unanswered += verdict.unanswered
    return out
