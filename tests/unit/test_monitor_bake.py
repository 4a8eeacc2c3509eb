"""The health monitor's part in a bake: while a new revision rolls out it reads every group leader's /metrics
(real HTTP on loopback, `FakeEngine`), hands the counters to the planner with the other engine facts, and sends
probe requests to a baking group that has served too few to be judged, paired with a Ready engine of the other
role."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator

import pytest

from pdfleet.operator.engines.bake_probes import PROBES_PER_RUN, BakeProber, Pair
from tests.support.fake_engines import FakeEngine
from tests.support.fake_fleet import DECODE, IPS, KEY, PODS, PREFILL, Fleet, engine_servers, rendered_fleet


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, FakeEngine]]:
    async with engine_servers(FakeEngine) as servers:
        yield servers


@pytest.fixture
def runs() -> list[tuple[Pair, int]]:
    return []


@pytest.fixture
def prober(runs: list[tuple[Pair, int]]) -> BakeProber:
    async def run(pair: Pair, requests: int) -> None:  # what the prober would send, recorded instead
        runs.append((pair, requests))
    return BakeProber(run=run)


@pytest.fixture
async def fleet(engines: dict[str, FakeEngine], prober: BakeProber) -> AsyncIterator[Fleet]:
    async with rendered_fleet(engines, prober=prober) as fleet:
        yield fleet


def served(requests: int, aborted: int = 0) -> str:
    return (f"# TYPE sglang:num_requests_total counter\nsglang:num_requests_total {requests}\n"
            f"# TYPE sglang:num_aborted_requests_total counter\nsglang:num_aborted_requests_total {aborted}\n")


def uid(fleet: Fleet, group: str) -> str:
    pod = fleet.kube.get("Pod", KEY[0], PODS[group])
    assert pod is not None
    return str(pod["metadata"]["uid"])


def baking(fleet: Fleet, group: str, *, since_requests: int) -> None:
    """The status as the planner writes it mid-rollout: the pool came from another revision, and `group` has
    baked 4 of its 5 minutes since its leader had served `since_requests`."""
    now = datetime.datetime.now(datetime.UTC)
    stamp = (now - datetime.timedelta(minutes=4)).strftime("%Y-%m-%dT%H:%M:%SZ")  # past the bake's midpoint
    until = (now + datetime.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def write(pool: dict) -> None:
        status = pool["status"]
        status["currentRevision"] = "an-older-one"
        for g in status["groups"]:
            if g["name"] == group:
                g.pop("verifiedRevision", None)
                g["verification"] = {"revision": g["revision"], "gates": [
                    {"name": "eventLoop", "state": "Passed"}, {"name": "bake", "state": "Waiting"}],
                    "bake": {"since": stamp, "until": until,
                             "start": [{"pod": uid(fleet, group), "requests": since_requests}]}}
    fleet.kube.update("InferencePool", *KEY, write)


async def test_a_quiet_baking_group_is_sampled_and_probed_paired_with_the_other_role(
        fleet: Fleet, engines: dict[str, FakeEngine], runs: list[tuple[Pair, int]], prober: BakeProber) -> None:
    engines[DECODE].metrics, engines[PREFILL].metrics = served(105), served(300)
    baking(fleet, DECODE, since_requests=100)
    await fleet.monitor.poll(KEY)
    await prober.idle()
    facts = fleet.monitor.facts(KEY)
    assert facts[DECODE].metrics[uid(fleet, DECODE)].requests == 105
    assert facts[PREFILL].metrics[uid(fleet, PREFILL)].requests == 300, "the baseline's leaders are read too"
    [(pair, requests)] = runs
    assert (pair.group, pair.decode_ip, pair.prefill_ip) == (DECODE, IPS[DECODE], IPS[PREFILL])
    assert requests == min(PROBES_PER_RUN, 20 - 5), "what minRequests still lacks, a run at a time"

    # Enough served in the window now: no more probes.
    engines[DECODE].metrics = served(125)
    await fleet.monitor.poll(KEY)
    await prober.idle()
    assert len(runs) == 1


async def test_what_the_routers_saw_of_each_sampled_engine_is_added_to_its_counters(
        fleet: Fleet, engines: dict[str, FakeEngine]) -> None:
    engines[DECODE].metrics, engines[PREFILL].metrics = served(105), served(300)
    url = {group: f"http://{IPS[group]}:{engines[group].port}" for group in (DECODE, PREFILL)}  # as the pool has them
    fleet.router.outcomes = {url[DECODE]: (90, 15), url[PREFILL]: (300, 0), "http://127.9.9.9:1": (5, 5)}
    baking(fleet, DECODE, since_requests=100)
    await fleet.monitor.poll(KEY)
    facts = fleet.monitor.facts(KEY)
    decode = facts[DECODE].metrics[uid(fleet, DECODE)]
    assert (decode.requests, decode.routed, decode.routed_failed) == (105, 105, 15)
    prefill = facts[PREFILL].metrics[uid(fleet, PREFILL)]
    assert (prefill.routed, prefill.routed_failed) == (300, 0)

    fleet.router.outcomes = {}
    await fleet.router.close()  # a router that does not answer: the engines' own counters still count
    await fleet.monitor.poll(KEY)
    assert fleet.monitor.facts(KEY)[DECODE].metrics[uid(fleet, DECODE)].routed == 0


async def test_nothing_is_read_or_sent_when_no_rollout_is_under_way(
        fleet: Fleet, engines: dict[str, FakeEngine], runs: list[tuple[Pair, int]], prober: BakeProber) -> None:
    engines[DECODE].metrics = served(1)
    await fleet.monitor.poll(KEY)
    assert not any(path == "/metrics" for _, path, _ in engines[DECODE].requests)
    await prober.idle()
    assert fleet.monitor.facts(KEY)[DECODE].metrics == {}
    assert runs == []
