"""The simulated engine's capacity model, alone: prefill batches, the decode step under a batch, the measured
generation rate (`runtime/simulator/capacity.py`)."""

from __future__ import annotations

import asyncio
import time

import pytest

from pdfleet.runtime.simulator import capacity
from pdfleet.runtime.simulator.config import Timing


def test_a_decode_step_lasts_the_iteration_until_the_batch_outgrows_the_decode_throughput() -> None:
    assert capacity.decode_step_s(4, 0.010, 1000) == 0.010  # 4 tokens in 10 ms: 400/s, under 1000/s
    assert capacity.decode_step_s(20, 0.010, 1000) == 0.020  # 20 tokens at 1000/s
    assert capacity.decode_step_s(500, 0.010, 0) == 0.010  # no throughput set: the step alone
    assert capacity.decode_step_s(0, 0.010, 1000) == 0.010


def test_a_prefill_forward_takes_the_waiting_prompts_that_fit_and_always_the_first() -> None:
    assert capacity.take_batch([4, 4, 4], 10) == 2
    assert capacity.take_batch([30, 4], 10) == 1  # longer than a forward takes: alone
    assert capacity.take_batch([4, 30], 10) == 1
    assert capacity.take_batch([], 10) == 0


def test_timing_defaults_keep_a_short_prompt_as_fast_as_before_and_env_sets_the_capacity() -> None:
    default = Timing.from_env({}, max_running=None, context_len=None)
    assert default.prefill_s(1000) == pytest.approx(0.005 + 0.02)  # 5 ms + 0.02 ms a token, as before the batches
    assert (default.decode_tokens_per_s, default.max_prefill_tokens, default.max_running) == (0, 16384, 64)
    set_ = Timing.from_env({"PDFLEET_SIM_PREFILL_TOKENS_PER_S": "1000", "PDFLEET_SIM_DECODE_TOKENS_PER_S": "50"},
                           max_running=8, context_len=None, max_prefill_tokens=2048)
    assert set_.prefill_s(100) == pytest.approx(0.105)
    assert (set_.decode_tokens_per_s, set_.max_prefill_tokens, set_.max_running) == (50, 2048, 8)


async def test_prompts_that_arrive_together_share_forwards_first_come_first_served() -> None:
    forwards: list[int] = []
    started: list[int] = []

    def cost(tokens: int) -> float:
        forwards.append(tokens)
        return 0.01

    batches = capacity.PrefillBatches(cost, max_tokens=10)
    await asyncio.gather(*(batches.prefill(4, lambda n=n: started.append(n)) for n in range(5)))
    assert forwards == [8, 8, 4]
    assert started == [0, 1, 2, 3, 4]


async def test_an_abandoned_prompt_leaves_the_queue_and_a_forward_nobody_waits_for_stops() -> None:
    forwards: list[int] = []

    def cost(tokens: int) -> float:
        forwards.append(tokens)
        return 30.0 if tokens == 7 else 0.01  # the abandoned prompt's forward would hold the next for 30 s

    batches = capacity.PrefillBatches(cost, max_tokens=7)
    first = asyncio.create_task(batches.prefill(7, lambda: None))
    while not forwards:  # its forward runs
        await asyncio.sleep(0)
    queued = asyncio.create_task(batches.prefill(5, lambda: None))
    await asyncio.sleep(0)
    queued.cancel()  # gone while waiting: never forwarded
    first.cancel()  # gone mid-forward: the forward stops
    began = time.monotonic()
    await batches.prefill(3, lambda: None)
    assert time.monotonic() - began < 5
    assert forwards == [7, 3] and batches.waiting == 0


def test_the_generation_rate_is_what_was_made_over_the_window() -> None:
    now = [100.0]
    rate = capacity.Rate(window_s=2.0, clock=lambda: now[0])
    assert rate.per_s() == 0
    for _ in range(10):
        rate.add(20)
        now[0] += 0.1
    assert rate.per_s() == 100  # 200 tokens over 2 s
    now[0] += 3
    assert rate.per_s() == 0  # nothing made lately: it decays, as SGLang's does


async def test_admission_grants_a_slot_and_kv_room_first_come_first_served() -> None:
    admission = capacity.Admission(slots=3, kv_tokens=100)
    await admission.acquire(60)
    order: list[str] = []

    async def ask(name: str, tokens: int) -> None:
        await admission.acquire(tokens)
        order.append(name)

    big = asyncio.create_task(ask("big", 50))  # 60 + 50 > 100: waits
    small = asyncio.create_task(ask("small", 10))  # would fit, but does not overtake the big one
    await asyncio.sleep(0.01)
    assert order == [] and (admission.running, admission.reserved) == (1, 60)
    admission.release(60)
    await asyncio.gather(big, small)
    assert order == ["big", "small"] and (admission.running, admission.reserved) == (2, 60)
    await admission.acquire(5)  # the third slot
    fourth = asyncio.create_task(ask("fourth", 1))
    await asyncio.sleep(0.01)
    assert order == ["big", "small"], "every slot taken: it waits though the KV has room"
    admission.release(5)
    await fourth
    huge = asyncio.create_task(ask("huge", 1000))  # more than the whole pool: admitted alone, once it is empty
    for tokens in (50, 10, 1):
        admission.release(tokens)
    await huge
    assert (admission.running, admission.reserved) == (1, 100)


async def test_a_request_that_gives_up_waiting_lets_the_next_one_in() -> None:
    admission = capacity.Admission(slots=4, kv_tokens=100)
    await admission.acquire(90)
    blocked = asyncio.create_task(admission.acquire(50))
    behind = asyncio.create_task(admission.acquire(10))
    await asyncio.sleep(0.01)
    assert not behind.done()
    blocked.cancel()  # its client went away: the one behind it fits now
    await asyncio.wait_for(behind, 1)
    assert (admission.running, admission.reserved) == (2, 100)
