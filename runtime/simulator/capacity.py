"""What bounds a simulated engine's throughput, so that load shows as it does on a real one.

`PrefillBatches`: SGLang's prefill runs the waiting prompts together in one forward, at most
`--max-prefill-tokens` prompt tokens of them, and a forward costs a fixed part plus its tokens at the prefill
throughput. A prompt that arrives while a forward runs waits for the next: under load the batches grow, each
takes longer, and time to first token grows with them.

`decode_step_s`: one decode iteration makes a token for every running request; it takes the rank iteration, or
longer once the batch is more than the decode throughput makes in one: inter-token latency grows with the batch.

`Admission`: a request runs once a running-request slot is free and the KV pool has room for its prompt and the
tokens it may generate, first come first served; until then it waits (SGLang's waiting queue), never refused.

`Rate`: the tokens made per second over the last seconds, as SGLang's `gen_throughput` reports what its last
decode batches made (not what a formula says they could).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable


def decode_step_s(running: int, base_step_s: float, tokens_per_s: float) -> float:
    """How long one decode iteration of `running` requests takes: `base_step_s`, or `running / tokens_per_s`
    when that is longer (`tokens_per_s` 0: no limit beyond the step)."""
    if tokens_per_s <= 0 or running <= 0:
        return base_step_s
    return max(base_step_s, running / tokens_per_s)


def take_batch(waiting: list[int], max_tokens: int) -> int:
    """How many of the `waiting` prompts (their token counts, first come first) the next prefill forward takes:
    as many as fit in `max_tokens`, and always the first, however long (SGLang chunks a long one instead; the
    simulator runs it whole)."""
    total = n = 0
    for tokens in waiting:
        if n and total + tokens > max_tokens:
            break
        total += tokens
        n += 1
    return n


@dataclasses.dataclass(eq=False)
class _Prompt:
    tokens: int
    started: Callable[[], None]  # called as its forward starts
    done: asyncio.Future[None]


class PrefillBatches:
    """Prompts prefilled in batches, one forward at a time, first come first served.

    `cost(tokens)` is a forward's duration for that many prompt tokens, read as the forward starts (so a fault
    that slows the engine applies from the next forward). A forward whose every prompt was abandoned (their
    clients went away) stops: nobody waits for it, and the next batch should not wait behind it either.
    """

    def __init__(self, cost: Callable[[int], float], max_tokens: int) -> None:
        self._cost = cost
        self._max_tokens = max(1, max_tokens)
        self._waiting: collections.deque[_Prompt] = collections.deque()
        self._batch: list[_Prompt] = []
        self._forward: asyncio.Task[None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self.forwards = 0  # forwards run (or started): a test reads how the prompts were batched

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def prefill(self, tokens: int, started: Callable[[], None]) -> None:
        """Return once this prompt's forward finished; `started` is called when it starts."""
        prompt = _Prompt(tokens, started, asyncio.get_running_loop().create_future())
        self._waiting.append(prompt)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run())
        try:
            await prompt.done
        finally:
            # Abandoned (a cancelled waiter cancels the future it awaits): out of the queue, or out of its forward.
            if prompt.done.cancelled() or not prompt.done.done():
                prompt.done.cancel()
                if prompt in self._waiting:
                    self._waiting.remove(prompt)
                elif (self._forward is not None and prompt in self._batch
                      and all(p.done.done() for p in self._batch)):
                    self._forward.cancel()

    async def _run(self) -> None:
        while self._waiting:
            # A waiter cancelled a moment ago may not have taken itself out yet: it is no part of a batch.
            self._waiting = collections.deque(p for p in self._waiting if not p.done.done())
            if not self._waiting:
                break
            n = take_batch([p.tokens for p in self._waiting], self._max_tokens)
            self._batch = [self._waiting.popleft() for _ in range(n)]
            for prompt in self._batch:
                prompt.started()
            self.forwards += 1
            self._forward = asyncio.create_task(asyncio.sleep(self._cost(sum(p.tokens for p in self._batch))))
            await asyncio.wait([self._forward])  # not `await`: a forward cancelled above is no error here
            for prompt in self._batch:
                if not prompt.done.done():
                    prompt.done.set_result(None)
            self._batch, self._forward = [], None


class Admission:
    """`slots` running requests at most, holding `kv_tokens` of KV at most between them, granted in arrival order.

    A request asks for its prompt plus its `max_new_tokens`: SGLang reserves room for the output it expects before
    it admits a request (an estimate it adjusts; this reserves all of it, so a request once running always fits).
    The first in line waits for room rather than letting later, smaller requests overtake it. A request larger
    than the whole pool is admitted alone.
    """

    def __init__(self, slots: int, kv_tokens: int) -> None:
        self.slots = max(1, slots)
        self.kv_tokens = max(1, kv_tokens)
        self.running = 0
        self.reserved = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def _size(self, tokens: int) -> int:
        return min(max(1, tokens), self.kv_tokens)

    def _fits(self, size: int) -> bool:
        return self.running < self.slots and self.reserved + size <= self.kv_tokens

    async def acquire(self, tokens: int) -> None:
        size = self._size(tokens)
        if not self._waiters and self._fits(size):
            self._take(size)
            return
        granted = asyncio.get_running_loop().create_future()
        self._waiters.append((size, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # granted, but its request went away meanwhile
                self.release(tokens)
            else:
                self._waiters = collections.deque(w for w in self._waiters if w[1] is not granted)
                self._grant()  # it may have held back smaller requests behind it
            raise

    def release(self, tokens: int) -> None:
        self.running -= 1
        self.reserved -= self._size(tokens)
        self._grant()

    def _take(self, size: int) -> None:
        self.running += 1
        self.reserved += size

    def _grant(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            size, granted = self._waiters.popleft()
            if not granted.done():
                self._take(size)
                granted.set_result(None)


class Rate:
    """Events per second over the last `window_s` (counted in tenths of a second)."""

    def __init__(self, window_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        self._buckets: collections.deque[list[float]] = collections.deque()  # [tenth of a second, count]

    def add(self, n: int = 1) -> None:
        tenth = float(int(self._clock() * 10))
        if self._buckets and self._buckets[-1][0] == tenth:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([tenth, float(n)])
        self._trim()

    def per_s(self) -> float:
        self._trim()
        return sum(n for _, n in self._buckets) / self._window_s

    def _trim(self) -> None:
        oldest = self._clock() * 10 - self._window_s * 10
        while self._buckets and self._buckets[0][0] < oldest:
            self._buckets.popleft()
