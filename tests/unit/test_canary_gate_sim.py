"""The gate's canary run (`engines.canary_runner.run_once`) against a real simulated prefill and decode engine on
127.0.0.1, paired as sglang-router pairs them (the decode engine fetches the prefill's KV by bootstrap room): it
passes on healthy engines and fails, naming the cause, when the decode engine leaks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from pdfleet.operator.api.status import GateState
from pdfleet.operator.engines import canary_runner
from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.planning.rollout.canary_gate import CanaryFinding
from tests.support import sim_engine
from tests.support.canary import LEAKS
from tests.support.operator_process import free_port
from tests.support.sim_engine import SimEngine


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimEngine, SimEngine]]:
    with sim_engine.pd_pair(tmp_path_factory.mktemp("sim")) as engines:
        yield engines


@pytest.fixture
async def engines() -> AsyncIterator[EngineClient]:
    client = EngineClient()
    try:
        yield client
    finally:
        await client.close()


def target(prefill: SimEngine, decode: SimEngine, *, bootstrap_port: int | None = None) -> canary_runner.Target:
    return canary_runner.Target(decode_uid="u1", decode_ip="127.0.0.1", decode_port=decode.port,
                              prefill_name="sim-prefill", prefill_ip="127.0.0.1", prefill_port=prefill.port,
                              bootstrap_port=bootstrap_port or prefill.bootstrap_port, model="sim-model",
                              parser="deepseekv32")


async def test_a_healthy_pair_passes(pair: tuple[SimEngine, SimEngine], engines: EngineClient) -> None:
    found = await canary_runner.run_once(engines, target(*pair))
    assert found.state is GateState.PASSED, found.message
    assert found.message == ("4 tool request(s) answered with structured tool_calls, no DSML markup in 10 answer(s); "
                             "2 answer(s) cut inside the call by max_tokens 2, kept to the contract (paired with "
                             "prefill sim-prefill)")


async def found_once(engines: EngineClient, run: canary_runner.Target, holds: Callable[[CanaryFinding], bool],
                     what: str, timeout: float = 15.0) -> CanaryFinding:
    """Runs the canary until its finding `holds` (an annotated fault applies within the engine's 200 ms poll)."""
    deadline = time.monotonic() + timeout
    found = await canary_runner.run_once(engines, run)
    while not holds(found) and time.monotonic() < deadline:
        found = await canary_runner.run_once(engines, run)
    assert holds(found), f"{what}: {found.message}"
    return found


@pytest.mark.parametrize("fault", sorted(LEAKS))
async def test_a_leaking_decode_engine_fails_naming_the_cause(pair: tuple[SimEngine, SimEngine], fault: str,
                                                              engines: EngineClient) -> None:
    prefill, decode = pair
    decode.annotate(fault=fault)
    try:
        found = await found_once(engines, target(prefill, decode), lambda f: f.state is GateState.FAILED and
                                 f.message.startswith(f"DSML markup in content ({LEAKS[fault]})"), fault)
    finally:
        decode.annotate(fault="none")
    others = set(LEAKS.values()) - {LEAKS[fault]}
    assert not any(f"({other})" in found.message for other in others), found.message
    assert "paired with prefill sim-prefill" in found.message and "; sample (" in found.message
    await found_once(engines, target(prefill, decode), lambda f: f.state is GateState.PASSED, "healthy again")


async def test_a_decode_engine_that_returns_a_call_cut_by_max_tokens_broken_fails_naming_it(
        pair: tuple[SimEngine, SimEngine], engines: EngineClient) -> None:
    prefill, decode = pair
    decode.annotate(fault="truncated-call")
    try:
        found = await found_once(engines, target(prefill, decode), lambda f: f.state is GateState.FAILED, "cut")
    finally:
        decode.annotate(fault="none")
    assert found.message.startswith(
        "a call cut by max_tokens came back with arguments that are not a JSON object (truncated-call) in 2 "
        "answer(s) (of 10 answers, paired with prefill sim-prefill); sample (truncated-call): 'get_weather: "
        '{"city": "pdfle\''), found.message
    await found_once(engines, target(prefill, decode), lambda f: f.state is GateState.PASSED, "healthy again")


async def test_a_decode_engine_that_cannot_reach_its_prefill_is_inconclusive(
        pair: tuple[SimEngine, SimEngine], engines: EngineClient) -> None:
    found = await canary_runner.run_once(engines, target(*pair, bootstrap_port=free_port()), timeout_s=3,
                                       run_timeout_s=10)
    assert found.state is GateState.WAITING
    assert found.message.startswith("the last canary run was inconclusive, retrying: 8 of 8 request(s) failed "
                                    "(paired with prefill sim-prefill), the most frequent error: "), found.message
