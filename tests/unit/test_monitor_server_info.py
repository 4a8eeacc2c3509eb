"""The health monitor's part in verification: it fetches each update-revision group leader's /server_info once per
pod (real HTTP on loopback, `tests.support.fake_engines.FakeEngine`), ties what it saw to the pods it judged
(`EngineFacts`), and the reconcile turns that into the groups' verification gates."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pdfleet.operator.controller import Controller
from pdfleet.runtime.health import phases, report
from tests.support.fake_engines import FakeEngine, S, rank
from tests.support.fake_fleet import DECODE, KEY, LOOPS, PODS, PREFILL, Fleet, engine_servers, rendered_fleet

# toolCallCanary: switched off by default; bake: not for a first revision (nor with NO_BAKE)
CANARY = {"toolCallCanary": "Skipped", "bake": "Skipped"}
# The fake agents say nothing of their patches, as an engine runtime older than patch reports.
UNSAID = {"patches": "Skipped"}

@pytest.fixture
async def engines() -> AsyncIterator[dict[str, FakeEngine]]:
    async with engine_servers(FakeEngine) as servers:
        yield servers


@pytest.fixture
async def fleet(engines: dict[str, FakeEngine]) -> AsyncIterator[Fleet]:
    async with rendered_fleet(engines) as fleet:
        yield fleet


def wired(fleet: Fleet) -> Controller:
    """An executor reading the monitor's engine facts, as `handlers.startup` wires it."""
    return Controller(client=fleet.kube, cache=fleet.kube.cache(), health=fleet.monitor.health,
                      engines=fleet.monitor.facts)


def server_info_requests(engine: FakeEngine) -> int:
    return sum(1 for method, path, _ in engine.requests if (method, path) == ("GET", "/server_info"))


def gates(fleet: Fleet, group: str) -> dict[str, str]:
    pool = fleet.kube.get("InferencePool", *KEY)
    assert pool is not None
    found: dict[str, Any] = next(g for g in pool["status"]["groups"] if g["name"] == group)
    return {g["name"]: g["state"] for g in found["verification"]["gates"]}


async def test_server_info_is_fetched_once_per_pod_and_handed_to_the_planner(
        fleet: Fleet, engines: dict[str, FakeEngine]) -> None:
    await fleet.monitor.poll(KEY)
    await fleet.monitor.poll(KEY)
    assert [server_info_requests(engines[g]) for g in (PREFILL, DECODE)] == [1, 1]
    facts = fleet.monitor.facts(KEY)
    decode_pod = fleet.kube.get("Pod", KEY[0], PODS[DECODE])
    assert decode_pod is not None
    uid = decode_pod["metadata"]["uid"]
    assert facts[DECODE].pods == frozenset({uid})
    assert facts[DECODE].server_info[uid]["tp_size"] == 2
    assert "version" not in facts[DECODE].server_info[uid], "only the compared fields are kept"

    await wired(fleet).reconcile(KEY)
    assert gates(fleet, DECODE) == {"eventLoop": "Passed", "serverArgs": "Passed", **UNSAID, **CANARY}
    assert gates(fleet, PREFILL) == {"eventLoop": "Passed", "serverArgs": "Passed", **UNSAID, **CANARY}


async def test_an_engine_showing_other_args_fails_the_server_args_gate(
        fleet: Fleet, engines: dict[str, FakeEngine]) -> None:
    engines[DECODE].args["disable_overlap_schedule"] = True  # the wrong-server-args fault
    await fleet.monitor.poll(KEY)
    await wired(fleet).reconcile(KEY)
    assert gates(fleet, DECODE) == {"eventLoop": "Passed", "serverArgs": "Failed", **UNSAID, **CANARY}
    [warning] = fleet.events("RolloutGateFailed")
    assert warning["type"] == "Warning"
    assert "disable_overlap_schedule: expected False, seen True" in warning["message"]


async def test_groups_not_at_the_update_revision_are_not_asked(fleet: Fleet, engines: dict[str, FakeEngine]) -> None:
    fleet.kube.update("InferencePool", *KEY, lambda p: p["spec"]["engine"].update(overlapSchedule="Disabled"))
    await fleet.monitor.poll(KEY)
    assert [server_info_requests(engines[g]) for g in (PREFILL, DECODE)] == [0, 0]
    assert fleet.monitor.facts(KEY)[DECODE].server_info == {}


def started(fleet: Fleet, group: str, seconds_ago: float) -> None:
    """Kubelet's word that the group's pod's container started `seconds_ago` (wall clock, whole seconds)."""
    at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    status = [{"name": "engine", "state": {"running": {"startedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ")}}}]
    fleet.kube.update("Pod", KEY[0], PODS[group], lambda p: p["status"].update(containerStatuses=status))


def attached(entry: report.RankEntry, at_ns: int) -> report.RankEntry:
    return dataclasses.replace(entry, record=dataclasses.replace(entry.record, attached_ns=at_ns))


async def test_a_predecessor_answering_at_a_new_pods_address_fails_no_gate_and_the_pods_own_engine_passes(
        fleet: Fleet, engines: dict[str, FakeEngine]) -> None:
    # CI, test_rollout_under_load_e2e: the replacing decode pod's IP still belonged to its predecessor's stopping
    # processes, whose agent and engine answered for it (the old loop, the old args) until the new pod's own
    # launcher died on "Address already in use"; the gate failed at the new revision and held for good.
    started(fleet, DECODE, seconds_ago=1)
    agent = fleet.agents[DECODE]
    agent.now_ns = 100 * S
    old = phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE
    agent.ranks = [attached(rank(n, loop=old), 40 * S) for n in range(2)]  # ranks 60 s old: not this pod's
    engines[DECODE].args["disable_overlap_schedule"] = True
    await fleet.monitor.poll(KEY)
    await wired(fleet).reconcile(KEY)
    assert gates(fleet, DECODE) == {"eventLoop": "Waiting", "serverArgs": "Waiting", "patches": "Waiting",
                                     **CANARY}
    assert fleet.events("RolloutGateFailed") == []
    assert server_info_requests(engines[DECODE]) == 0, "the predecessor's engine is not asked either"

    # The predecessor is gone; the pod's own ranks (attached after it started) and engine answer.
    agent.ranks = [attached(rank(n, loop=LOOPS[DECODE]), 99 * S) for n in range(2)]
    engines[DECODE].args["disable_overlap_schedule"] = False
    await fleet.monitor.poll(KEY)
    await wired(fleet).reconcile(KEY)
    assert gates(fleet, DECODE) == {"eventLoop": "Passed", "serverArgs": "Passed", **UNSAID, **CANARY}
