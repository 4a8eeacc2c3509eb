"""The autoscaler's reading of an engine's load (`EngineClient.engine_metrics`, `planning.scale.engine_load`) against
the engine simulator started through the launcher as a pod starts it, serving SGLang 0.5.23's metric names and labels
(tests/unit/test_sim_load.py checks those against SGLang's own collectors): idle it reads nothing queued or
running; under a burst beyond its running-request slots the queue, the running batch and KV usage show, and the
inter-token latency over the window between two reads grows with the batch."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator

import httpx
import pytest

from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.planning.scale import engine_load
from pdfleet.operator.planning.scale.engine_load import LoadSample
from tests.support import sim_engine
from tests.support.sim_engine import SimEngine

SLOTS = 2
ENV = {"PDFLEET_SIM_DECODE_TOKENS_PER_S": "100", "PDFLEET_SIM_PREFILL_TOKENS_PER_S": "500"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimEngine]:
    started = {"unified": sim_engine.start(tmp_path_factory.mktemp("load"), "null", tp=1,
                                           extra=["--max-running-requests", str(SLOTS)], env=ENV)}
    with sim_engine.serving(started):
        yield started["unified"]


def pod(uid: str) -> dict:
    return {"metadata": {"name": uid, "uid": uid}, "status": {"podIP": "127.0.0.1"}}


def read(engine: SimEngine) -> LoadSample:
    async def once() -> LoadSample:
        client = EngineClient(timeout=5)
        try:
            got = await client.engine_metrics(pod("u"), engine.port)
        finally:
            await client.close()
        assert got.load is not None and got.serving is not None, "one answer gives both"
        return got.load
    return asyncio.run(once())


def generate(engine: SimEngine, n: int) -> int:
    return httpx.post(engine.url + "/generate", timeout=60, json={
        "text": " ".join(["word"] * 49 + [str(n)]), "sampling_params": {"max_new_tokens": 30}}).status_code


def test_a_burst_shows_as_queue_running_usage_and_a_longer_inter_token_latency(engine: SimEngine) -> None:
    idle = read(engine)
    assert (idle.queue, idle.running, idle.token_usage) == (0, 0, 0)
    assert generate(engine, 0) == 200
    alone = read(engine)
    lone = engine_load.window(idle, alone)
    assert lone.itl_count > 0

    seen: list[LoadSample] = []
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = [pool.submit(generate, engine, n) for n in range(1, 9)]
        deadline = time.monotonic() + 30
        while not all(a.done() for a in answers) and time.monotonic() < deadline:
            seen.append(read(engine))
            time.sleep(0.05)
        assert [a.result() for a in answers] == [200] * 8
    busy = read(engine)
    assert max(s.running for s in seen) == SLOTS, "the running batch, up to the engine's slots"
    assert max(s.queue for s in seen) >= 1, "the rest waited"
    assert max(s.token_usage for s in seen) > 0
    burst = engine_load.window(alone, busy)
    assert burst.itl_count > lone.itl_count
    assert burst.itl_sum / burst.itl_count > lone.itl_sum / lone.itl_count, "a batch of 2 steps slower than 1"
