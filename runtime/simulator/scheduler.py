"""The request side of the simulated engine: admission, queues, the capacity model, PD hand-off.

A request waits for one of `max_running` slots and KV room for its prompt and output (`capacity.Admission`, first
come first served; SGLang's waiting queue, a PD decode's prealloc queue), then runs: its prompt is prefilled in a
batch with the others waiting (`capacity.PrefillBatches`: a forward of at most `max_prefill_tokens` prompt tokens
costs `prefill_s(its tokens)`), plus one rank iteration; each decode token is one rank iteration (a busy
iteration lasts `decode_step_s`), longer when the running batch is more than `decode_tokens_per_s` makes in a
step, or under the `slow-requests` fault. Every running request decodes in the same iterations: continuous
batching. So under load requests queue, time to first token grows with the prefill batches and inter-token
latency with the decode batch. Rank iterations come from the rank processes (`ticks`), so nothing advances while
the ranks are stuck.

PD: the prefill side answers after its KV was taken by the decode side (its inflight queue until then, its KV
counted in `used_tokens`); the decode side fetches the KV (its transfer queue) and continues from the prefill's
first token.

Latency (`latency`, SGLang's histograms), from when `generate` took the request: time to first token, once per
successful request (a prefill engine's when its prefill made the token, before the decode side takes the KV; a
decode engine's includes the KV transfer); each next token's time since the previous one (decode, unified).
`gen_throughput` is what the decode steps made over the last seconds, measured.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus

import aiohttp

from pdfleet.runtime.simulator import capacity, kv, latency, tokenizer
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


class _Place:
    """The queue a request is in: moving it keeps the scheduler's counts."""

    def __init__(self, scheduler: Scheduler, queue: str) -> None:
        self._scheduler = scheduler
        self.queue: str | None = None
        self.go(queue)

    def go(self, queue: str | None) -> None:
        self._scheduler._move(self.queue, queue)
        self.queue = queue


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
        # SGLang counts requests and tokens per value of `is_streaming`: (what, "true" or "false") -> count.
        self.streamed: collections.Counter[tuple[str, str]] = collections.Counter()
        self.ttft = latency.time_to_first_token()
        self.itl = latency.inter_token_latency()
        self.in_flight = 0
        self.used_tokens = 0  # KV held: prompts from their prefill on, and the tokens decoded since
        self.prefills = capacity.PrefillBatches(lambda tokens: timing.prefill_s(tokens) * control.latency_factor,
                                                timing.max_prefill_tokens)
        self.generated = capacity.Rate()
        self.admission = capacity.Admission(timing.max_running, timing.max_total_tokens)
        self._idle = asyncio.Event()
        self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def gen_throughput(self) -> float:
        """Tokens per second the decode steps made over the last seconds (SGLang's `gen_throughput`)."""
        return self.generated.per_s()

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
        streaming = latency.is_streaming(req.stream)
        self.streamed["num_requests", streaming] += 1
        self.streamed["prompt_tokens", streaming] += len(req.input_ids)
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
                    self.streamed["generation_tokens", streaming] += 1
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

    async def _prefill_side(self, req: Request, started: float) -> int:
        key = tokenizer.prompt_key(req.input_ids)
        place = _Place(self, "prefill_bootstrap")
        kv_held = 0
        try:  # whatever ends the request (a cancelled client included), it leaves the queue it is in
            # No transfer engine to meet: the bootstrap handshake is immediate, and the request waits in SGLang's
            # waiting queue for a slot and a prefill forward.
            place.go("waiting")
            need = len(req.input_ids) + 1  # the prompt and the one token a prefill makes
            await self.admission.acquire(need)
            try:
                def forward_started() -> None:
                    nonlocal kv_held
                    place.go("running")
                    kv_held = len(req.input_ids)  # its KV stays until the decode side took it
                    self.used_tokens += kv_held

                await self._forward_prefill(len(req.input_ids), forward_started)
            finally:
                self.admission.release(need)
            place.go("prefill_inflight")
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
            self.used_tokens -= kv_held
            place.go(None)
        self.streamed["generation_tokens", latency.is_streaming(req.stream)] += 1
        self.ttft.observe(ttft, latency.is_streaming(req.stream))
        return first

    async def _run(self, req: Request) -> AsyncIterator[int]:
        """A unified engine: waiting (for a slot, then a prefill forward), running. A PD decode engine: its
        prealloc queue (for a slot: SGLang preallocates the request's KV there), transfer, running."""
        key = tokenizer.prompt_key(req.input_ids)
        decode = self.engine.mode == "decode"
        place = _Place(self, "decode_prealloc" if decode else "waiting")
        kv_held = 0
        slot = False

        def running() -> None:
            nonlocal kv_held
            place.go("running")
            kv_held = len(req.input_ids)
            self.used_tokens += kv_held

        need = len(req.input_ids) + req.max_new_tokens
        try:
            await self.admission.acquire(need)
            slot = True
            if decode:
                place.go("decode_transfer")
                first = await self._transfer(req)
                running()
            else:
                await self._forward_prefill(len(req.input_ids), running)
                first = tokenizer.output_token(key, 0)
            made = time.monotonic()
            yield first
            for i in range(1, req.max_new_tokens):
                await self.ticks.advance(1)
                await self._decode_pace(made)
                kv_held += 1
                self.used_tokens += 1
                self.generated.add()
                made = time.monotonic()
                yield tokenizer.output_token(key, i)
        finally:
            self.used_tokens -= kv_held
            place.go(None)
            if slot:
                self.admission.release(need)

    async def _forward_prefill(self, prompt_tokens: int, started: Callable[[], None]) -> None:
        """The prompt's prefill forward, batched with the others waiting (`capacity.PrefillBatches`), then the
        rank iteration that ran it."""
        await self.prefills.prefill(prompt_tokens, started)
        await self.ticks.advance(1)

    async def _decode_pace(self, since: float) -> None:
        """A decode step lasts one rank iteration (waited for already), or longer: `capacity.decode_step_s` once
        the running batch is more than the decode throughput makes in a step, and `latency_factor` times that
        under `slow-requests`. It sleeps what is left of the step since the previous token (`since`): a fixed
        extra sleep would let the ranks iterate meanwhile, and the next step's wait for an iteration would come
        up short."""
        base = self.timing.decode_step_s
        step = capacity.decode_step_s(self.queues["running"], base, self.timing.decode_tokens_per_s)
        step *= max(1.0, self.control.latency_factor)
        if step > base:
            left = since + step - time.monotonic()
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
