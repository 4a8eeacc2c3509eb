"""A client load through a pool's router, counting every request that fails and why.

    pdfleet-sim load --url http://127.1.4.3:8000 [--concurrency 4] [--duration 60] [--timeout 15]
    pdfleet-sim load --pool NAMESPACE/NAME --kubeconfig K ...     every Ready router pod, as a Service would
    pdfleet-sim load --url ... --rate 20 --duration 60            20 requests a second, whatever the answers take
    pdfleet-sim load --url ... --steps 5x30,20x60,5x30            rate steps: 5/s for 30 s, 20/s for 60 s, ...
    pdfleet-sim load --url ... --ramp 5:60:5 --ramp-seconds 180   5/s up to 60/s and back to 5/s, in an odd
                                                                  number of equal steps of about --step-seconds
                                                                  (default 15)

`--concurrency` is a closed loop: that many clients, each sending its next request once the last answered, so
a slow fleet is sent less. `--rate`, `--steps` and `--ramp` are an open loop: requests start on a schedule
however long the earlier ones take, as a fleet's many independent clients do, so a slow fleet's load piles up
(queues, time to first token) instead of backing off. Each step is a phase; at the end every phase is reported
with what its requests saw (a request belongs to the phase it was sent in): sent, ok, failed, p50 and p99.

Each worker sends, in turn, the three kinds of request a client of an SGLang pool sends: `/generate`, a chat
completion, and a streamed chat completion (the last two through the `openai` client, as users do). A request
fails when it gets an HTTP error, a connection error, no answer within `--timeout`, or, streamed, a body that
ends without the `[DONE]` sentinel: sglang-router passes a decode failure on as a truncated SSE body, which
clients that stop at the end of the stream would count as a success.

The counters are plain data (`Tally`) so tests and the demo read the same numbers that are printed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import itertools
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai

KINDS = ("generate", "chat", "chat-stream")
FAILURE_PAUSE_S = 0.5
# One request's attempts: the endpoint the last went to ("base") and the one a retry must avoid ("avoid"). A
# mutable holder, since the sender runs in a task of its own (asyncio.wait_for), which copies the context.
_ATTEMPTS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("loadgen_attempts", default=None)


@dataclasses.dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    retried: int = 0  # requests sent again after a refused connection (with endpoints to choose from)
    failures: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    by_kind: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    first_failure_at: float | None = None
    last_failure_at: float | None = None

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    @property
    def in_flight(self) -> int:
        return self.sent - self.ok - self.failed

    def record(self, kind: str, started: float, failure: str | None) -> None:
        now = time.monotonic()
        if failure is None:
            self.ok += 1
            self.by_kind[kind] += 1
            self.latencies_s.append(now - started)
            return
        self.failures[f"{kind}: {failure}"] += 1
        self.first_failure_at = self.first_failure_at or now
        self.last_failure_at = now

    def line(self) -> str:
        lat = sorted(self.latencies_s[-500:])
        p50 = f"{statistics.median(lat) * 1000:.0f}ms" if lat else "-"
        reasons = ", ".join(f"{k} x{n}" for k, n in self.failures.most_common(3))
        return (f"requests {self.sent}  ok {self.ok}  failed {self.failed}  in flight {self.in_flight}  "
                f"p50 {p50}" + (f"  ({reasons})" if reasons else ""))

    def summary(self) -> dict[str, object]:
        lat = sorted(self.latencies_s)
        return {"sent": self.sent, "ok": self.ok, "failed": self.failed, "in_flight": self.in_flight,
                "retried": self.retried,
                "failures": dict(self.failures), "ok_by_kind": dict(self.by_kind),
                "p50_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
                "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1) if lat else None}


@dataclasses.dataclass(frozen=True)
class Step:
    """`rate` requests a second for `seconds`: one phase of an open-loop load."""

    rate: float
    seconds: float

    def __str__(self) -> str:
        return f"{self.rate:g}/s x {self.seconds:g}s"


def parse_steps(text: str) -> list[Step]:
    """`RATExSECONDS[,RATExSECONDS...]`, e.g. `5x30,20x60,5x30`. Raises ValueError."""
    steps = []
    for part in text.split(","):
        rate, sep, seconds = part.strip().partition("x")
        try:
            step = Step(float(rate), float(seconds))
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not RATExSECONDS (e.g. 20x60)") from None
        if not sep or step.rate < 0 or step.seconds <= 0:
            raise ValueError(f"{part.strip()!r}: a rate of at least 0 for more than 0 seconds, as RATExSECONDS")
        steps.append(step)
    return steps


def ramp(start: float, peak: float, end: float, seconds: float, step_s: float) -> list[Step]:
    """A staircase along the line from `start` up to `peak` at half of `seconds` and down to `end`: an odd
    number of equal steps of about `step_s` (at least 3), the first at `start`, the middle one at `peak`, the last
    at `end`, the others evenly between."""
    if seconds <= 0 or step_s <= 0 or min(start, peak, end) < 0:
        raise ValueError("a ramp needs rates of at least 0, and seconds and a step of more than 0")
    n = max(3, round(seconds / step_s))
    n += 1 - n % 2
    half = (n - 1) // 2
    rates = [start + (peak - start) * i / half for i in range(half)] + \
        [peak + (end - peak) * i / half for i in range(half + 1)]
    return [Step(round(rate, 2), round(seconds / n, 3)) for rate in rates]


def parse_ramp(text: str, seconds: float, step_s: float) -> list[Step]:
    """`START:PEAK:END` over `seconds`. Raises ValueError."""
    try:
        start, peak, end = (float(v) for v in text.split(":"))
    except ValueError:
        raise ValueError(f"--ramp {text!r} is not START:PEAK:END (e.g. 5:60:5)") from None
    return ramp(start, peak, end, seconds, step_s)


@dataclasses.dataclass
class Phase:
    """What the requests sent during one step saw."""

    step: Step
    tally: Tally = dataclasses.field(default_factory=Tally)
    elapsed_s: float = 0.0  # how long it lasted: its step's seconds, or less when the load was stopped

    def summary(self) -> dict[str, object]:
        per_s = round(self.tally.sent / self.elapsed_s, 2) if self.elapsed_s else None
        seconds = None if math.isinf(self.step.seconds) else self.step.seconds  # --rate without --duration
        return {"rate": self.step.rate, "seconds": seconds, "sent_per_s": per_s, **self.tally.summary()}

    def line(self) -> str:
        s = self.summary()
        ms = ("-" if s["p50_ms"] is None else f"{s['p50_ms']:.0f}ms", "-" if s["p99_ms"] is None
              else f"{s['p99_ms']:.0f}ms")
        reasons = ", ".join(f"{k} x{n}" for k, n in self.tally.failures.most_common(3))
        waiting = f"  in flight {s['in_flight']}" if s["in_flight"] else ""
        return (f"{self.step!s:>16}  sent {s['sent']} ({s['sent_per_s']}/s)  ok {s['ok']}  failed {s['failed']}"
                f"{waiting}  p50 {ms[0]}  p99 {ms[1]}" + (f"  ({reasons})" if reasons else ""))


class BadAnswer(Exception):
    """An answer that came back, but is not a whole one (empty, truncated, an error inside a stream)."""


def _describe(e: BaseException) -> str:
    if isinstance(e, BadAnswer):
        return str(e)
    if isinstance(e, httpx.HTTPStatusError):
        return f"HTTP {e.response.status_code}"
    if isinstance(e, openai.APIStatusError):
        return f"HTTP {e.status_code}"
    if isinstance(e, httpx.TimeoutException | openai.APITimeoutError | TimeoutError):
        return "timeout"
    if isinstance(e, httpx.TransportError | openai.APIConnectionError):
        return "connection error"
    return type(e).__name__


class Load:
    """`concurrency` workers sending requests to `url` until stopped.

    With `endpoints`, each request goes to the next of the URLs it returns at that moment (to `url` when it
    returns none): what a client behind a Service sees, whose proxy sends new connections only to the ready
    endpoints (`url` alone is one fixed address). A request whose connection was refused never reached a
    server, so it is sent once more, to another endpoint than the one that refused it, as a balancer's
    connect-failure retry does (Envoy's `previous_hosts` predicate; counted in `retried`): with the turn shared
    by every worker, "the next endpoint" could be the dead one again. Any failure after the connection is
    counted.
    """

    def __init__(self, url: str, *, model: str = "default", concurrency: int = 4, timeout_s: float = 15.0,
                 max_tokens: int = 16, endpoints: Callable[[], Sequence[str]] | None = None) -> None:
        self.url = url.rstrip("/")
        self._endpoints = endpoints
        self._turn = itertools.count()
        self.used: set[str] = set()  # every base URL a request was sent to
        self.model = model
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self.tally = Tally()
        self.phases: list[Phase] = []
        self._stop = asyncio.Event()
        # An open loop holds as many connections as requests are in flight: httpx's default pool (100) would
        # queue them in the client, where the fleet under test cannot be seen to be slow.
        self._http = httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(max_connections=None,
                                                                              max_keepalive_connections=100))
        self._openai: dict[str, openai.AsyncOpenAI] = {}
        self._counter = itertools.count()

    def _base(self) -> str:
        found = [u.rstrip("/") for u in self._endpoints()] if self._endpoints is not None else []
        attempts = _ATTEMPTS.get()
        others = [u for u in found if attempts is None or u != attempts.get("avoid")]
        choice = others or found
        base = choice[next(self._turn) % len(choice)] if choice else self.url
        self.used.add(base)
        if attempts is not None:
            attempts["base"] = base
        return base

    def _chat_client(self, base: str) -> openai.AsyncOpenAI:
        if base not in self._openai:
            # No retries: a failure the router let through is what this counts.
            self._openai[base] = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", timeout=self.timeout_s,
                                                    max_retries=0)
        return self._openai[base]

    async def _generate(self, n: int) -> None:
        r = await self._http.post(f"{self._base()}/generate", json={
            "text": f"request {n}: the quick brown fox", "sampling_params": {"max_new_tokens": self.max_tokens}})
        r.raise_for_status()
        if not r.json().get("text"):
            raise BadAnswer("no text")

    async def _chat(self, n: int) -> None:
        out = await self._chat_client(self._base()).chat.completions.create(
            model=self.model, max_tokens=self.max_tokens,
            messages=[{"role": "user", "content": f"request {n}: say something"}])
        if not out.choices or not out.choices[0].message.content:
            raise BadAnswer("empty completion")

    async def _chat_stream(self, n: int) -> None:
        # Raw SSE, not the openai iterator: the iterator treats a body cut short as a clean end of stream.
        body = {"model": self.model, "max_tokens": self.max_tokens, "stream": True,
                "messages": [{"role": "user", "content": f"request {n}: stream something"}]}
        done, chunks = False, 0
        async with self._http.stream("POST", f"{self._base()}/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    payload = json.loads(line[6:])
                    if "error" in payload:
                        raise BadAnswer("error in stream")
                    chunks += 1
        if not done or not chunks:
            raise BadAnswer("truncated stream")

    async def _request(self, kind: str, tallies: Sequence[Tally], *, counted: bool = False) -> bool:
        """Send one request of `kind`, counted in each of `tallies` (as sent already, if `counted`); whether it
        succeeded."""
        senders: dict[str, Callable[[int], object]] = {
            "generate": self._generate, "chat": self._chat, "chat-stream": self._chat_stream}
        n = next(self._counter)
        for tally in () if counted else tallies:
            tally.sent += 1
        started = time.monotonic()
        try:
            await self._send(senders[kind], n)
        except Exception as e:  # every failure is counted, by kind and cause
            for tally in tallies:
                tally.record(kind, started, _describe(e))
            return False
        for tally in tallies:
            tally.record(kind, started, None)
        return True

    async def _worker(self, index: int) -> None:
        kinds = itertools.cycle(KINDS[index % len(KINDS):] + KINDS[:index % len(KINDS)])
        while not self._stop.is_set():
            if not await self._request(next(kinds), (self.tally,)):
                # A client backs off after a failure: a refused connection fails in microseconds, and a tight
                # retry loop would count a router that is down thousands of times a second.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), FAILURE_PAUSE_S)

    async def _send(self, sender: Callable[[int], object], n: int) -> None:
        attempts: dict[str, str] = {}
        _ATTEMPTS.set(attempts)
        try:
            await asyncio.wait_for(sender(n), self.timeout_s)  # type: ignore[arg-type]
        except (httpx.ConnectError, openai.APIConnectionError) as e:
            refused = isinstance(e, httpx.ConnectError) or isinstance(e.__cause__, httpx.ConnectError)
            if self._endpoints is None or not refused:
                raise
            self.tally.retried += 1
            attempts["avoid"] = attempts.get("base", "")
            await asyncio.wait_for(sender(n), self.timeout_s)  # type: ignore[arg-type]

    def stop(self) -> None:
        self._stop.set()

    async def run(self, duration_s: float | None = None, *, report_every_s: float = 0.0) -> Tally:
        """The closed loop: `concurrency` clients, each sending its next request when the last one ended."""
        workers = [asyncio.create_task(self._worker(i)) for i in range(self.concurrency)]
        deadline = None if duration_s is None else time.monotonic() + duration_s
        try:
            while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                try:
                    await asyncio.wait_for(self._stop.wait(), report_every_s or 1.0)
                except TimeoutError:
                    if report_every_s:
                        print(self.tally.line(), flush=True)
        finally:
            self._stop.set()
            await asyncio.gather(*workers, return_exceptions=True)
            await self._close()
        return self.tally

    async def run_steps(self, steps: Sequence[Step], *, report: Callable[[Phase], None] | None = None) -> list[Phase]:
        """The open loop: each step's requests start `1 / rate` seconds apart from the step's start (no drift,
        whatever the answers take), kinds in turn; then every request still in flight is waited for (each ends
        within `timeout_s`). `report` is called with each phase as it ends (its latest requests may still be in
        flight); the phases returned are whole."""
        kinds = itertools.cycle(KINDS)
        in_flight: set[asyncio.Task[bool]] = set()
        try:
            for step in steps:
                phase = Phase(step)
                self.phases.append(phase)
                begun = time.monotonic()
                k = 0
                while not self._stop.is_set():
                    due = begun + k / step.rate if step.rate > 0 else begun + step.seconds
                    if due >= begun + step.seconds:
                        break
                    if due > time.monotonic():
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._stop.wait(), due - time.monotonic())
                        continue
                    # Counted as sent now: its task may start only after the phase was reported.
                    self.tally.sent += 1
                    phase.tally.sent += 1
                    task = asyncio.create_task(self._request(next(kinds), (self.tally, phase.tally), counted=True))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                    k += 1
                left = begun + step.seconds - time.monotonic()
                if left > 0 and not self._stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), left)
                phase.elapsed_s = time.monotonic() - begun
                if report is not None:
                    report(phase)
                if self._stop.is_set():
                    break
            await asyncio.gather(*in_flight, return_exceptions=True)
        finally:
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
            await self._close()
        return self.phases

    async def _close(self) -> None:
        await self._http.aclose()
        for client in self._openai.values():
            await client.close()


ROUTER_SELECTOR = "app.kubernetes.io/component=router,pdfleet.dev/pool={pool}"


def ready_urls(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """The URLs of the Ready, not terminating pods among `pods` (on their `http` port): the endpoints a Service
    would send new connections to."""
    urls = []
    for pod in pods:
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        port = next((p["containerPort"] for c in pod.get("spec", {}).get("containers") or []
                     for p in c.get("ports") or [] if p.get("name") == "http"), None)
        if ready and port and status.get("podIP") and not pod["metadata"].get("deletionTimestamp"):
            urls.append(f"http://{status['podIP']}:{port}")
    return sorted(urls)


async def follow_routers(kubeconfig: Path, where: str, endpoints: list[str], stop: asyncio.Event,
                         every_s: float = 0.5) -> None:
    """Keeps `endpoints` the Ready router pods of pool `where` (namespace/name), read from the apiserver."""
    from pdfleet.podrunner.kube import Client, Kubeconfig

    namespace, _, pool = where.partition("/")
    client = Client(Kubeconfig(kubeconfig))
    try:
        while not stop.is_set():
            listed = await client.list(f"/api/v1/namespaces/{namespace}/pods",
                                       {"labelSelector": ROUTER_SELECTOR.format(pool=pool)})
            endpoints[:] = ready_urls(listed.get("items") or [])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
    finally:
        await client.close()


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="pdfleet-sim load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="one router, e.g. http://<router pod IP>:<port>")
    target.add_argument("--pool", metavar="NAMESPACE/NAME", help="every Ready router pod of this pool, followed "
                        "as they come and go (as a client behind the router's Service): needs --kubeconfig")
    p.add_argument("--kubeconfig", type=Path, default=None, help="for --pool (default: $KUBECONFIG)")
    p.add_argument("--model", default="default", help="model name sent in chat requests")
    p.add_argument("--concurrency", type=int, default=4, help="closed loop: this many clients (default 4)")
    p.add_argument("--duration", type=float, default=None, help="seconds (default: until interrupted); with "
                   "--rate, the one phase's length")
    schedule = p.add_mutually_exclusive_group()
    schedule.add_argument("--rate", type=float, help="open loop: requests a second")
    schedule.add_argument("--steps", help="open loop: rate steps, RATExSECONDS,... (e.g. 5x30,20x60,5x30)")
    schedule.add_argument("--ramp", metavar="START:PEAK:END", help="open loop: a linear ramp up to PEAK and back "
                          "down (requests a second) over --ramp-seconds, in steps of --step-seconds")
    p.add_argument("--ramp-seconds", type=float, default=180.0, help="the ramp's length (default 180)")
    p.add_argument("--step-seconds", type=float, default=15.0, help="the ramp's step, one phase (default 15)")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds before a request counts as failed")
    p.add_argument("--every", type=float, default=1.0, help="seconds between progress lines (0: none)")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    args = p.parse_args(argv)
    kubeconfig = args.kubeconfig or (Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None)
    if args.pool and ("/" not in args.pool or kubeconfig is None):
        p.error("--pool takes NAMESPACE/NAME and needs --kubeconfig or $KUBECONFIG")
    steps: list[Step] | None = None
    try:
        if args.rate is not None:
            steps = [Step(args.rate, args.duration or float("inf"))]
            if args.rate <= 0:
                raise ValueError("--rate must be more than 0")
        elif args.steps:
            steps = parse_steps(args.steps)
        elif args.ramp:
            steps = parse_ramp(args.ramp, args.ramp_seconds, args.step_seconds)
    except ValueError as e:
        p.error(str(e))
    endpoints: list[str] = []
    load = Load(args.url or "http://127.0.0.1:9", model=args.model, concurrency=args.concurrency,
                timeout_s=args.timeout, endpoints=(lambda: endpoints) if args.pool else None)

    async def send() -> Tally:
        if steps is None:
            return await load.run(args.duration, report_every_s=args.every)
        if not args.json:
            print(f"{len(steps)} phase(s): {', '.join(map(str, steps))}", flush=True)
        await load.run_steps(steps, report=None if args.json else lambda phase: print(
            f"phase {len(load.phases)}/{len(steps)} ended: {phase.line()}", flush=True))
        return load.tally

    async def until_stopped() -> Tally:
        # SIGTERM as well as Ctrl-C: a script stops its background load with `kill`, and expects the summary.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, load.stop)
        if not args.pool:
            return await send()
        stop = asyncio.Event()
        follower = asyncio.create_task(follow_routers(kubeconfig, args.pool, endpoints, stop))
        try:
            while not endpoints and not follower.done():  # the first listing, before the first request
                await asyncio.sleep(0.1)
            return await send()
        finally:
            stop.set()
            await follower

    tally = asyncio.run(until_stopped())
    if args.json:
        summary = tally.summary()
        if steps is not None:
            summary["phases"] = [phase.summary() for phase in load.phases]
        print(json.dumps(summary), flush=True)
        return 0
    if steps is not None:
        print("phases, each with the requests sent in it (whole now):", flush=True)
        for phase in load.phases:
            print(f"  {phase.line()}", flush=True)
    print(f"final: {tally.line()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
