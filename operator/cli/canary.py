"""`pdfleet canary URL`: the tool-call canary against a router or an engine, for people and scripts.

Exit codes: 0 passed; 1 failed (each cause named); 2 usage, or the URL answers no OpenAI-compatible API."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from pdfleet.operator.cli.report import Exit
from pdfleet.operator.planning.rollout.toolcall_canary import DEFAULT_CONCURRENCY, DEFAULT_REQUESTS, Report
from pdfleet.runtime.toolcalls.markup import EXPECTED_BLOCK

EPILOG = """exit codes: 0 every tool request got structured tool_calls, no answer held DSML markup in its content,
calls cut by max_tokens came back as docs/toolcalls.md says, no request failed; 1 any of those did not hold (the
causes are named: parser-off, stripped-markers, wrong-version-markers, malformed-call, truncated-call,
cut-finish-reason, stream-mismatch, malformed structured calls, tool requests answered without calls, errors);
2 usage, or the URL answers no OpenAI-compatible API (GET /v1/models fails)."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    canary = commands.add_parser(
        "canary", epilog=EPILOG, help="tool-call canary: are tool calls structured under concurrent mixed load?",
        description="Sends concurrent chat requests with tools (tool_choice auto and required) interleaved with "
                    "plain ones, streamed and not, through the openai client to URL (a pool's router, or an "
                    "engine), then two tool requests (streamed and not) whose max_tokens ends inside the call, "
                    "and reports structured tool calls, DSML markup leaked into content by cause, calls cut by "
                    "max_tokens that break the contract by cause, malformed calls and errors.")
    canary.add_argument("url", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:30000 (/v1 is "
                                                   "added unless given)")
    canary.add_argument("--requests", type=_positive, default=DEFAULT_REQUESTS, metavar="N",
                        help=f"requests of the load, half with tools (default {DEFAULT_REQUESTS}); the cut check "
                             "adds 2")
    canary.add_argument("--concurrency", type=_positive, default=DEFAULT_CONCURRENCY, metavar="C",
                        help=f"requests in flight at once (default {DEFAULT_CONCURRENCY})")
    canary.add_argument("--model", help="the model to ask (default: the first that GET /v1/models lists)")
    canary.add_argument("--timeout", type=_seconds, default=60.0, metavar="S",
                        help="seconds one request may take (default 60)")
    canary.add_argument("--tool-call-parser", choices=sorted(EXPECTED_BLOCK), dest="parser",
                        help="the server's --tool-call-parser: markup of the other DeepSeek version is then "
                             "named wrong-version-markers (without it, it counts as parser-off or malformed-call)")
    canary.add_argument("--json", action="store_true", help="print the report as JSON")


def summary_lines(rep: Report, *, url: str, concurrency: int) -> Sequence[str]:
    """Counts, then the verdict with each cause and a sample of what leaked."""
    leaked = sum(rep.leaks.values())
    cut = f", {rep.cut_requests} cut by max_tokens" if rep.cut_requests else ""
    lines = [f"tool-call canary against {url} (model {rep.model}): {rep.requests} requests ({rep.tool_requests} "
             f"with tools, {rep.plain_requests} plain{cut}; streamed and not), concurrency {concurrency}, "
             f"{rep.duration_s:.1f}s",
             f"  structured tool calls: {rep.structured_calls} in {rep.answered_with_calls}/{rep.tool_requests} "
             f"tool answers",
             f"  markup in content: {leaked}"
             + (" (" + ", ".join(f"{c} {n}" for c, n in rep.leaks.most_common()) + ")" if leaked else ""),
             f"  malformed calls: {rep.malformed}, tool requests unanswered: {rep.unanswered}, errors: "
             f"{sum(rep.errors.values())}"]
    if rep.cut_not_sent is not None:
        lines.append(f"  cut inside the call by max_tokens: {rep.cut_check()}")
    elif rep.cut_requests:
        found = ", ".join(f"{c} {n}" for c, n in rep.cut.most_common())
        inside = rep.cut_requests - rep.cut_in_prose
        said = f"{inside} answer(s) " + (f"({found})" if found else "kept to the contract") if inside else ""
        prose = f"{rep.cut_in_prose} stopped in the prose before the call, testing nothing" if rep.cut_in_prose else ""
        lines.append(f"  cut inside the call by max_tokens {rep.cut_max_tokens}: "
                     + "; ".join(part for part in (said, prose) if part))
    if rep.passed:
        return [*lines, "PASS: every tool request got structured tool_calls; no markup in content; "
                        + ("calls cut by max_tokens as the contract says; "
                           if rep.cut_requests > rep.cut_in_prose else "")
                        + "no errors"]
    return [*lines, "FAIL: " + "; ".join(rep.failures()),
            *(f"  sample ({what}): {sample!r}" for what, sample in rep.samples.items())]


def run(args: argparse.Namespace, out: TextIO) -> int:
    from pdfleet.operator.engines import canary_requests  # the openai client, loaded only for this command

    try:
        rep = asyncio.run(canary_requests.run(args.url, requests=args.requests, concurrency=args.concurrency,
                                              model=args.model, timeout_s=args.timeout, parser=args.parser))
    except canary_requests.Unreachable as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.ERROR
    if args.json:
        print(json.dumps({"url": args.url, "concurrency": args.concurrency, **rep.to_json()}, indent=2), file=out)
    else:
        for line in summary_lines(rep, url=args.url, concurrency=args.concurrency):
            print(line, file=out)
    return Exit.COMPLETE if rep.passed else Exit.FAILED
