"""The tool-call canary's plan and verdict, pure: which requests it sends, and what their answers say.

Tool requests (two tools, `tool_choice` "auto" or "required") are interleaved with plain ones, streamed and
not, so that tool requests share batches with plain ones (where SGLang < 0.5.8 strips DSML markers). An
answer passes when a tool request got structured `tool_calls` (valid calls to a declared tool) and no answer
holds DSML markup in its content. Markup is found and its cause named by the runtime's leak guard
(`pdfleet.runtime.toolcalls`), as seen from the client: a well-formed block of the expected version in content
means no parser ran (parser-off); one the strict parser refuses is a malformed call.

The cut check (`toolcall_cut`): the plan's first tool request is also a reference, greedy with room to end by
itself; once it is answered, two more ask the same greedily, streamed and not, with a `max_tokens` that ends
inside the call (`cuts`). Their answers are judged by the contract for a call cut short (docs/toolcalls.md).
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from pdfleet.operator.planning.rollout import toolcall_cut
from pdfleet.operator.planning.rollout.toolcall_cut import REFERENCE_MAX_TOKENS, STREAM_MISMATCH
from pdfleet.runtime.toolcalls.cut import json_object
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
    """One canary request: with tools (`tool_choice` set) or plain (None), streamed or not; the cut check's
    reference, or one of its cut probes (`cut_at`: its own max_tokens, which ends inside the call)."""

    index: int
    tool_choice: str | None
    stream: bool
    reference: bool = False
    cut_at: int | None = None

    @property
    def tools(self) -> bool:
        return self.tool_choice is not None


def plan(requests: int) -> list[Probe]:
    """Tool and plain requests alternating, each kind streamed and not in turn, `tool_choice` auto and required."""
    probes = []
    for i in range(requests):
        tools = i % 2 == 0
        choice = ("auto" if (i // 4) % 2 == 0 else "required") if tools else None
        probes.append(Probe(i, choice, stream=(i // 2) % 2 == 0, reference=i == 0))
    return probes


def cuts(reference: Answer, *, index: int) -> tuple[list[Probe], str | None]:
    """The cut probes the reference's answer allows (numbered from `index`), streamed and not: the same request
    as the reference, `tool_choice` auto (the route the contract was tested on), with a `max_tokens` that ends
    inside its call; or none, and why."""
    if reference.error is not None:
        return [], f"the reference tool request failed ({reference.error})"
    if not reference.calls:
        return [], "the reference tool request was answered without tool_calls"
    if reference.finish_reason == "length":
        return [], f"the reference tool answer did not end within {REFERENCE_MAX_TOKENS} tokens"
    at = toolcall_cut.budget(reference.completion_tokens, prose=reference.content,
                             calls=((c.name, c.arguments) for c in reference.calls))
    if at is None:
        return [], f"the reference tool answer is too short to cut ({reference.completion_tokens} token(s))"
    return [Probe(index, "auto", stream=True, cut_at=at), Probe(index + 1, "auto", stream=False, cut_at=at)], None


def plain(requests: int) -> list[Probe]:
    """Plain chat requests only, streamed and not in turn."""
    return [Probe(i, None, stream=i % 2 == 0) for i in range(requests)]


def body(probe: Probe, *, model: str, max_tokens: int) -> dict[str, Any]:
    """The `chat.completions.create` keyword arguments of a probe."""
    prompt = TOOL_PROMPT if probe.tools else PLAIN_PROMPT
    # A tool request that is not cut on purpose gets the reference's room: a whole DSML call with a real
    # tokenizer is tens of tokens, and one cut by a short budget is withheld by the contract, which would read
    # as a request answered without calls. `max_tokens` bounds the plain requests only.
    own = probe.cut_at if probe.cut_at is not None else REFERENCE_MAX_TOKENS if probe.tools else None
    # max_completion_tokens, not max_tokens: OpenAI's and SGLang's (0.5.x) current name; max_tokens is deprecated.
    kwargs: dict[str, Any] = {"model": model, "max_completion_tokens": own or max_tokens, "stream": probe.stream,
                              "messages": [{"role": "user", "content": prompt}]}
    if probe.tools:
        kwargs.update(tools=TOOLS, tool_choice=probe.tool_choice)
    if probe.reference or probe.cut_at is not None:
        # Greedy, so that a cut probe writes the reference's tokens up to its cut; and its length counted, streamed
        # too, to know it ran out of tokens.
        kwargs["temperature"] = 0
        if probe.stream:
            kwargs["stream_options"] = {"include_usage": True}
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
    completion_tokens: int | None = None  # `usage`, where the server said it


@dataclasses.dataclass(frozen=True)
class Verdict:
    leaks: tuple[Cause, ...] = ()
    malformed: tuple[str, ...] = ()  # why each structured call is not a valid call
    unanswered: bool = False  # a tool request without structured calls (and no leak to explain it)
    error: str | None = None
    sample: str = ""
    cut: tuple[tuple[str, str], ...] = ()  # a cut probe's breaches of the contract: (cause, sample)

    @property
    def ok(self) -> bool:
        return not (self.leaks or self.malformed or self.unanswered or self.error or self.cut)


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
    cut = probe.cut_at is not None and toolcall_cut.spent(answer.completion_tokens, probe.cut_at)
    calls = [c for c in answer.calls if json_object(c.arguments)] if cut else answer.calls  # the rest: cut
    malformed = tuple(m for m in map(_malformed, calls) if m)
    # A cut probe without calls is the contract kept when its only call was cut; the load's tool requests say
    # whether the server answers with calls at all.
    unanswered = probe.tools and probe.cut_at is None and not answer.calls and not causes
    sample = answer.content[:SAMPLE_CHARS] if causes else ""
    found = toolcall_cut.findings(((c.name, c.arguments) for c in answer.calls), answer.finish_reason) if cut else []
    return Verdict(causes, malformed, unanswered, None, sample, tuple((c, s[:SAMPLE_CHARS]) for c, s in found))


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
    cut_requests: int = 0  # the cut check's probes (its reference is one of the tool requests)
    cut_max_tokens: int | None = None
    cut_not_sent: str | None = None  # why the cut check sent no probe
    cut: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # cause -> answers
    cut_in_prose: int = 0  # cut answers that stopped in the reference's prose, before its call: nothing tested

    @property
    def passed(self) -> bool:
        return self.requests > 0 and not (self.leaks or self.malformed or self.unanswered or self.errors or self.cut)

    def tool_call_failures(self) -> list[str]:
        """What the answers showed wrong with tool calls, most telling first (errors left out)."""
        out = [f"DSML markup in content ({cause}) in {n} answer(s)" for cause, n in self.leaks.most_common()]
        out += [f"{toolcall_cut.WHAT[cause]} ({cause}) in {n} {'pair' if cause == STREAM_MISMATCH else 'answer'}(s)"
                for cause, n in self.cut.most_common()]
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

    def cut_check(self) -> str:
        """What the cut check did, in words ('' when the run had none: plain requests only)."""
        if self.cut_not_sent is not None:
            return f"no cut probe sent: {self.cut_not_sent}"
        if not self.cut_requests:
            return ""
        inside = self.cut_requests - self.cut_in_prose
        prose = (f"{self.cut_in_prose} answer(s) cut by max_tokens {self.cut_max_tokens} stopped in the prose "
                 f"before the call, testing nothing") if self.cut_in_prose else ""
        if not inside:
            return prose
        kept = "" if self.cut else ", kept to the contract"
        said = f"{inside} answer(s) cut inside the call by max_tokens {self.cut_max_tokens}{kept}"
        return f"{said}; {prose}" if prose else said

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "model": self.model, "requests": self.requests,
                "toolRequests": self.tool_requests,
                "plainRequests": self.plain_requests, "structuredCalls": self.structured_calls,
                "answeredWithCalls": self.answered_with_calls, "leaks": dict(self.leaks),
                "malformedCalls": self.malformed, "unanswered": self.unanswered, "errors": dict(self.errors),
                "cutRequests": self.cut_requests, "cutMaxTokens": self.cut_max_tokens,
                "cutNotSent": self.cut_not_sent, "cutFailures": dict(self.cut), "cutInProse": self.cut_in_prose,
                "samples": self.samples, "failures": self.failures(), "durationSeconds": round(self.duration_s, 3)}


def report(results: Iterable[tuple[Probe, Answer]], *, parser: str | None = None, duration_s: float = 0.0,
           cut_not_sent: str | None = None) -> Report:
    """The findings over `results`; `cut_not_sent`: why the cut check sent no probe, if it sent none."""
    out = Report(duration_s=duration_s, cut_not_sent=cut_not_sent)
    spent: list[tuple[Probe, Answer]] = []  # the cut probes' answers that ran out of tokens
    results = list(results)
    reference = next((a for p, a in results if p.reference and a.error is None), None)
    for probe, answer in results:
        out.requests += 1
        out.cut_requests += probe.cut_at is not None
        out.cut_max_tokens = probe.cut_at or out.cut_max_tokens
        out.tool_requests += probe.tools and probe.cut_at is None
        out.plain_requests += not probe.tools
        verdict = judge(probe, answer, parser=parser)
        if verdict.error is not None:
            out.errors[verdict.error] += 1
            continue
        if probe.cut_at is None:
            out.structured_calls += len(answer.calls)
            out.answered_with_calls += bool(answer.calls)
        elif toolcall_cut.spent(answer.completion_tokens, probe.cut_at):
            spent.append((probe, answer))
            out.cut_in_prose += (reference is not None and not answer.calls
                                 and toolcall_cut.in_prose(answer.content, reference.content))
        for cause in verdict.leaks:
            out.leaks[cause.value] += 1
            out.samples.setdefault(cause.value, verdict.sample)
        for cause, sample in verdict.cut:
            out.cut[cause] += 1
            out.samples.setdefault(cause, sample)
        out.malformed += bool(verdict.malformed)
        if verdict.malformed:
            out.samples.setdefault("malformed", verdict.malformed[0])
        out.unanswered += verdict.unanswered
    _compare_streams(spent, out)
    return out


def _compare_streams(spent: list[tuple[Probe, Answer]], out: Report) -> None:
    """A streamed and a non-streamed answer cut at the same max_tokens that differ: a stream-mismatch."""
    by_cut: dict[int | None, dict[bool, Answer]] = collections.defaultdict(dict)
    for probe, answer in spent:
        by_cut[probe.cut_at][probe.stream] = answer
    for pair in by_cut.values():
        if len(pair) < 2:
            continue
        streamed, answered = (toolcall_cut.shape(((c.name, c.arguments) for c in pair[s].calls),
                                                 pair[s].finish_reason) for s in (True, False))
        if streamed != answered:
            out.cut[STREAM_MISMATCH] += 1
            out.samples.setdefault(STREAM_MISMATCH, f"streamed {streamed!r}, not streamed {answered!r}"[:SAMPLE_CHARS])
