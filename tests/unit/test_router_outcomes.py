"""What a bake reads of the routers: the real sglang-router in PD mode in front of a simulated prefill and decode
engine on 127.0.0.1, requests sent through it, and its Prometheus port read through the operator's client
(`EngineClient.routed`): each engine's URL, with every request the router saw end there."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.render.router_objects import METRICS_PORT
from tests.support import sim_engine
from tests.support.sim_engine import SimEngine

REQUESTS = 4


def _chat(port: int) -> None:
    body = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.status == 200


@pytest.fixture(scope="module")
def routed_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimEngine, SimEngine, int]]:
    """A PD pair behind a real router that has served REQUESTS chat requests; yields (prefill, decode, the
    router's metrics port)."""
    tmp = tmp_path_factory.mktemp("routed")
    with sim_engine.pd_pair(tmp) as (prefill, decode), sim_engine.router(tmp, prefill, decode) as router:
        for _ in range(REQUESTS):
            _chat(router.port)
        yield prefill, decode, router.metrics_port


async def test_the_router_says_what_it_saw_of_each_engine(routed_pair: tuple[SimEngine, SimEngine, int]) -> None:
    prefill, decode, metrics = routed_pair
    router = {"metadata": {"name": "pool-router-x"}, "status": {"podIP": "127.0.0.1"}}
    client = EngineClient(addressing=lambda pod, port: ("127.0.0.1", metrics if port == METRICS_PORT else port))
    try:
        seen = await client.routed(router)
    finally:
        await client.close()
    assert seen is not None, "the router's Prometheus port answers with metrics"
    for engine in (prefill, decode):
        ended, failed = seen.get(f"http://127.0.0.1:{engine.port}", (0.0, 0.0))
        assert (ended, failed) == (REQUESTS, 0), f"{engine.role}: {seen}"
