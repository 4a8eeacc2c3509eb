"""A quiet baking group gets the operator's own probe requests (`engines.bake_probes`), paired as sglang-router
pairs them in PD, and they land in the engines' own /metrics counters, which the bake reads through the same
client as /server_info (`engines.engine_client`). Against a real simulated prefill and decode engine on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from pdfleet.operator.api.status import ServingSample
from pdfleet.operator.engines import bake_probes
from pdfleet.operator.engines.bake_probes import BakeProber, Pair
from pdfleet.operator.engines.engine_client import EngineClient
from tests.support import sim_engine
from tests.support.sim_engine import SimEngine


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimEngine, SimEngine]]:
    with sim_engine.pd_pair(tmp_path_factory.mktemp("sim")) as engines:
        yield engines


def pod(uid: str) -> dict:
    return {"metadata": {"name": uid, "uid": uid}, "status": {"podIP": "127.0.0.1"}}


async def counters(engine: SimEngine, uid: str) -> ServingSample:
    client = EngineClient(timeout=5)
    try:
        found = await client.metrics(pod(uid), engine.port)
    finally:
        await client.close()
    assert found is not None, "the engine's /metrics shows SGLang's request counters"
    return found


async def test_probes_through_the_pair_land_in_both_engines_counters(pair: tuple[SimEngine, SimEngine]) -> None:
    prefill, decode = pair
    before = {"p": await counters(prefill, "p"), "d": await counters(decode, "d")}
    engines = EngineClient()
    try:
        await bake_probes.probe(engines, Pair(group="g-decode-0", prefill_ip="127.0.0.1", prefill_port=prefill.port,
                                              bootstrap_port=prefill.bootstrap_port, decode_ip="127.0.0.1",
                                              decode_port=decode.port, model="sim-model"), 6)
    finally:
        await engines.close()
    after = {"p": await counters(prefill, "p"), "d": await counters(decode, "d")}
    assert after["d"].requests - before["d"].requests == 6, "every probe was served by the decode engine"
    assert after["p"].requests - before["p"].requests == 6, "and its prefill half by the prefill engine"
    assert after["d"].aborted == before["d"].aborted
    assert after["d"].itl_count > before["d"].itl_count and after["d"].ttft_count - before["d"].ttft_count == 6, \
        "the latency histograms the bake compares grew too"
    assert after["d"].pod == "d"


async def test_an_unreachable_pair_is_said_not_raised() -> None:
    # Nothing listens on these ports: the run ends, the monitor goes on (and the bake keeps waiting for traffic).
    engines = EngineClient()
    try:
        await bake_probes.probe(engines, Pair(group="g", prefill_ip="127.0.0.1", prefill_port=1, bootstrap_port=1,
                                              decode_ip="127.0.0.1", decode_port=1, model="m"), 2)
    finally:
        await engines.close()


async def test_one_run_per_group_at_a_time_bounded_in_requests() -> None:
    started: list[tuple[str, int]] = []
    release = asyncio.Event()

    async def run(target: Pair, requests: int) -> None:
        started.append((target.group, requests))
        await release.wait()

    prober = BakeProber(run=run)
    a = Pair(group="a", prefill_ip="127.0.0.1", prefill_port=1, bootstrap_port=1, decode_ip="127.0.0.1",
             decode_port=2, model="m")
    b = Pair(group="b", prefill_ip="127.0.0.1", prefill_port=1, bootstrap_port=1, decode_ip="127.0.0.1",
             decode_port=3, model="m")
    prober.ensure(("ns", "pool"), a, 100)
    prober.ensure(("ns", "pool"), a, 100)  # under way: not another
    prober.ensure(("ns", "pool"), b, 3)
    release.set()
    await prober.idle()
    assert started == [("a", bake_probes.PROBES_PER_RUN), ("b", 3)]
    prober.ensure(("ns", "pool"), a, 1)  # the first run ended: the next may start
    await prober.idle()
    assert started[-1] == ("a", 1) and prober.sent == bake_probes.PROBES_PER_RUN + 3 + 1
    await prober.close()
