"""The request side of the simulated engine: admission, queues, the timing model, PD hand-off.

A request waits for one of `max_running` slots (SGLang's waiting queue; a PD prefill's bootstrap queue, a
PD decode's prealloc queue), then runs: a prefill costs `prefill_s(prompt tokens)` plus one rank iteration,
each decode token one rank iteration (a busy iteration lasts `decode_step_s`, or the `slow` fault's delay).
Every running request decodes in the same iterations: continuous batching. Rank iterations come from the
rank processes (`ticks`), so nothing advances while the ranks are stuck.

PD: the prefill side answers after its KV was taken by the decode side (its inflight queue until then);
the decode side fetches the KV (its transfer queue) and continues from the prefill's first token.

Latency (`latency`, SGLang's histograms), from when `generate` took the request: time to first token, once per
successful request (a prefill engine's when its prefill made the token, before the decode side takes the KV; a
decode engine's includes the KV transfer); each next token's time since the previous one (decode, unified).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import AsyncIterator
from http import HTTPStatus

import aiohttp

from pdfleet.runtime.simulator import kv, latency, tokenizer
from pdfleet.runtime.simulator.config import Engine, Timing
from pdfleet.runtime.simulator.ranks import Control
from pdfleet.runtime.simulator.ticks import Ticks


class RequestError(Exception):
    """A request SGLang would abort: its HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Request:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    stream: bool = False  # only a label of the time to first token


QUEUES = ("waiting", "running", "prefill_bootstrap", "prefill_inflight", "decode_prealloc", "decode_transfer")


class Scheduler:
    def __init__(self, engine: Engine, timing: Timing, ticks: Ticks, control: Control, rooms: kv.Rooms) -> None:
        self.engine = engine
        self.timing = timing
        self.ticks = ticks
        self.control = control
        self.rooms = rooms
        self.session: aiohttp.ClientSession | None = None
        self.queues: collections.Counter[str] = collections.Counter({q: 0 for q in QUEUES})
        self.totals: collections.Counter[str] = collections.Counter()
        self.ttft = latency.time_to_first_token()
        self.itl = latency.inter_token_latency()
        self.in_flight = 0
        self.used_tokens = 0
        self._slots = asyncio.Semaphore(timing.max_running)
        self._idle = asyncio.Event()
        self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def _move(self, frm: str | None, to: str | None) -> None:
        if frm:
            self.queues[frm] -= 1
        if to:
            self.queues[to] += 1
        # The ranks run forwards while anything is running, idle iterations otherwise.
        if self.queues["running"] > 0:
            self.control.busy.set()
        else:
            self.control.busy.clear()

    def check(self, req: Request) -> None:
        """Refuse what SGLang's scheduler refuses, before anything is queued."""
        if self.engine.pd and req.bootstrap_room is None:
            raise RequestError(HTTPStatus.BAD_REQUEST, "Invalid request: Disaggregated request received without "
                                                       f"bootstrap room id. req.rid={req.rid!r}")
        if len(req.input_ids) >= self.timing.context_len:
            raise RequestError(HTTPStatus.BAD_REQUEST,
                               f"The input ({len(req.input_ids)} tokens) is longer than the model's context "
                               f"length ({self.timing.context_len} tokens).")

    async def generate(self, req: Request) -> AsyncIterator[int]:
        """The request's output token ids, each as soon as it exists. Raises RequestError."""
        started = time.monotonic()
        self.check(req)
        self.control.requests += 1
        if self._fails(self.control.requests):
            self.totals["aborted"] += 1
            raise RequestError(HTTPStatus.INTERNAL_SERVER_ERROR,
                               f"Internal server error (simulated: the failing fault fails a "
                               f"{self.control.fail_share:g} share of requests) req.rid={req.rid!r}")
        self.in_flight += 1
        self._idle.clear()
        self.totals["requests"] += 1
        self.totals["prompt_tokens"] += len(req.input_ids)
        try:
            if self.engine.mode == "prefill":
                yield await self._prefill_side(req, started)
            else:
                last = None
                async for token in self._run(req):
                    now = time.monotonic()
                    if last is None:
                        self.ttft.observe(now - started, latency.is_streaming(req.stream))
                    else:
                        self.itl.observe(now - last)
                    last = now
                    self.totals["generation_tokens"] += 1
                    yield token
        except RequestError:
            self.totals["aborted"] += 1
            raise
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    def _fails(self, k: int) -> bool:
        """Whether the k-th request fails under `failing`: every time k * share passes a whole number, so a share
        of 0.25 fails the 4th, 8th, ... request, on every engine alike."""
        share = self.control.fail_share
        return share > 0 and int(k * share) > int((k - 1) * share)

    async def complete(self, req: Request) -> list[int]:
        """Every output token of a non-streamed request. Raises RequestError."""
        return [token async for token in self.generate(req)]

    async def _admit(self, queue: str) -> None:
        self._move(None, queue)
        try:
            await self._slots.acquire()
        except BaseException:
            self._move(queue, None)
            raise

    async def _prefill_side(self, req: Request, started: float) -> int:
        key = tokenizer.prompt_key(req.input_ids)
        await self._admit(queue := "prefill_bootstrap")
        try:  # whatever ends the request (a cancelled client included), it leaves the queue it is in
            self._move(queue, queue := "running")
            try:
                await self._forward_prefill(len(req.input_ids))
            finally:
                self._slots.release()
            self._move(queue, queue := "prefill_inflight")
            first = tokenizer.output_token(key, 0)
            ttft = time.monotonic() - started  # observed once the request succeeded
            if req.bootstrap_host != kv.FAKE_BOOTSTRAP_HOST:
                assert req.bootstrap_room is not None
                payload = {"input_ids": req.input_ids, "first_token": first, "rid": req.rid}
                if not await self.rooms.publish_and_wait(req.bootstrap_room, payload, self.timing.kv_wait_s):
                    self.totals["transfer_failed"] += 1
                    raise RequestError(HTTPStatus.INTERNAL_SERVER_ERROR,
                                       f"KV transfer failed for request rank=0 req.rid={req.rid!r} "
                                       f"req.bootstrap_room={req.bootstrap_room}: the decode side never took it "
                                       f"within {self.timing.kv_wait_s:.0f} s")
        finally:
            self._move(queue, None)
        self.totals["generation_tokens"] += 1
        self.ttft.observe(ttft, latency.is_streaming(req.stream))
        return first

    async def _run(self, req: Request) -> AsyncIterator[int]:
        key = tokenizer.prompt_key(req.input_ids)
        decode = self.engine.mode == "decode"
        await self._admit("decode_prealloc" if decode else "waiting")
        queue = "decode_prealloc" if decode else "waiting"
        try:
            if decode:
                self._move(queue, queue := "decode_transfer")
                first = await self._transfer(req)
            self._move(queue, queue := "running")
            self.used_tokens += len(req.input_ids)
            if not decode:
                await self._forward_prefill(len(req.input_ids))
                first = tokenizer.output_token(key, 0)
            made = time.monotonic()
            yield first
            for i in range(1, req.max_new_tokens):
                await self.ticks.advance(1)
                await self._slower(made, self.timing.decode_step_s)
                self.used_tokens += 1
                made = time.monotonic()
                yield tokenizer.output_token(key, i)
        finally:
            if queue == "running":
                self.used_tokens -= len(req.input_ids)
            self._move(queue, None)
            self._slots.release()

    async def _forward_prefill(self, prompt_tokens: int) -> None:
        await asyncio.sleep(self.timing.prefill_s(prompt_tokens) * self.control.latency_factor)
        await self.ticks.advance(1)

    async def _slower(self, since: float, step_s: float) -> None:
        """Under `slow-requests`, a decode step takes latency_factor times as long: after its rank iteration, it
        sleeps what is left of latency_factor x step_s since the previous token (`since`). A fixed extra sleep
        would let the ranks iterate meanwhile, and the next step's wait for an iteration would come up short."""
        if self.control.latency_factor > 1:
            left = since + step_s * self.control.latency_factor - time.monotonic()
            if left > 0:
                await asyncio.sleep(left)

    async def _transfer(self, req: Request) -> int:
        if req.bootstrap_host == kv.FAKE_BOOTSTRAP_HOST:
            return tokenizer.output_token(tokenizer.prompt_key(req.input_ids), 0)
        assert self.session is not None and req.bootstrap_room is not None
        started = time.monotonic()
        try:
            payload = await kv.fetch(self.session, str(req.bootstrap_host), int(req.bootstrap_port or 8998),
                                     req.bootstrap_room, self.timing.kv_wait_s)
        except kv.TransferFailed as e:
            self.totals["transfer_failed"] += 1
            raise RequestError(HTTPStatus.INTERNAL_SERVER_ERROR,
                               f"Decode handshake failed for request rank=0 req.rid={req.rid!r} "
                               f"req.bootstrap_room={req.bootstrap_room} with exception {e}") from None
        self.totals["transfer_ms"] += round((time.monotonic() - started) * 1000)
        return int(payload["first_token"])
