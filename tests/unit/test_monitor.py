"""The rank-health monitor against real HTTP agents on loopback (`tests.support.fake_engines`) and the in-memory
apiserver: what it asks, what it judges, when it pokes a reconcile, and that what it judged reaches the plan.
The verdict rules themselves are `test_rank_health`'s and `test_verdict`'s business."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pdfleet.operator import metrics
from pdfleet.operator.api.status import Verdict
from pdfleet.operator.cache import PoolKey
from pdfleet.operator.engines import monitor as monitor_mod
from pdfleet.operator.planning.health import restarts
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.runtime.health import phases
from tests.support.fake_engines import desynced, rank
from tests.support.fake_fleet import DECODE, KEY, PODS, PREFILL, URLS, Fleet, fake_fleet

HEARTBEAT_S = 20.0  # long: a poll in these tests happens because the test asks for it, never by the clock
DESYNC_AFTER_S = 30.0
HEALTH = {"health": {"heartbeatPeriod": "20s", "desyncAfter": "30s", "hangAfter": "1m"}}


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with fake_fleet(**HEALTH) as fleet:
        yield fleet


def verdicts(fleet: Fleet) -> dict[str, Verdict]:
    return {name: h.verdict for name, h in fleet.monitor.health(KEY).items()}


def asked(fleet: Fleet, group: str) -> int:
    return sum(1 for method, path, _ in fleet.agents[group].requests if (method, path) == ("GET", "/ranks"))


def group_status(fleet: Fleet, group: str) -> dict[str, Any]:
    pool = fleet.kube.get("InferencePool", *KEY)
    assert pool is not None
    return next(g for g in pool["status"]["groups"] if g["name"] == group)


async def test_healthy_groups_are_judged_once_per_poll_and_poke_a_reconcile_only_when_first_judged(
        fleet: Fleet) -> None:
    assert await fleet.monitor.poll(KEY) == HEARTBEAT_S
    assert verdicts(fleet) == {PREFILL: Verdict.HEALTHY, DECODE: Verdict.HEALTHY}
    assert fleet.monitor.health(KEY)[DECODE].ranks == 2
    assert fleet.pokes == [KEY]
    assert (asked(fleet, PREFILL), asked(fleet, DECODE)) == (1, 1)

    await fleet.monitor.poll(KEY)
    assert fleet.pokes == [KEY]  # nothing changed: no reconcile
    assert (asked(fleet, PREFILL), asked(fleet, DECODE)) == (2, 2)
    assert fleet.kube.take_writes() == []  # an unchanged verdict costs no API call at all


async def test_a_group_whose_ranks_report_a_desync_is_desync_in_the_plan_and_in_the_status(fleet: Fleet) -> None:
    await fleet.monitor.poll(KEY)
    await fleet.controller.reconcile(KEY)
    assert group_status(fleet, DECODE)["verdict"] == "Healthy"

    fleet.agents[DECODE].ranks = desynced(age_s=DESYNC_AFTER_S + 10)
    await fleet.monitor.poll(KEY)

    assert verdicts(fleet) == {PREFILL: Verdict.HEALTHY, DECODE: Verdict.DESYNC}
    assert fleet.pokes == [KEY, KEY]
    await fleet.controller.reconcile(KEY)  # what the poke asks for: the verdict is the plan's input
    assert group_status(fleet, DECODE)["verdict"] == "Desync"
    assert group_status(fleet, PREFILL)["verdict"] == "Healthy"


def detections(verdict: str) -> tuple[float, float]:
    """(count, sum) of the time-to-detect histogram for one verdict."""
    count = metrics.REGISTRY.get_sample_value("pdfleet_rank_health_detection_seconds_count", {"verdict": verdict})
    total = metrics.REGISTRY.get_sample_value("pdfleet_rank_health_detection_seconds_sum", {"verdict": verdict})
    return count or 0.0, total or 0.0


async def test_the_time_to_detect_a_desync_is_observed_once_per_episode(fleet: Fleet) -> None:
    await fleet.monitor.poll(KEY)
    count, total = detections("Desync")
    fleet.agents[DECODE].ranks = desynced(age_s=DESYNC_AFTER_S + 10)
    await fleet.monitor.poll(KEY)
    await fleet.monitor.poll(KEY)  # the same episode, seen again: not a second detection
    new_count, new_total = detections("Desync")
    assert new_count == count + 1
    assert DESYNC_AFTER_S + 10 <= new_total - total < DESYNC_AFTER_S + 15, "how long the ranks had been split"


async def test_ranks_briefly_at_different_positions_are_not_a_desync(fleet: Fleet) -> None:
    fleet.agents[DECODE].ranks = desynced(age_s=DESYNC_AFTER_S - 10)
    await fleet.monitor.poll(KEY)
    assert verdicts(fleet)[DECODE] is Verdict.HEALTHY


async def test_an_agent_that_never_answered_leaves_its_group_unknown(fleet: Fleet) -> None:
    await fleet.agents[DECODE].close()

    await fleet.monitor.poll(KEY)

    decode = fleet.monitor.health(KEY)[DECODE]
    assert decode.verdict is Verdict.UNKNOWN and "no rank agent has answered yet" in decode.message
    assert verdicts(fleet)[PREFILL] is Verdict.HEALTHY


async def test_an_agent_that_stops_answering_makes_its_group_unreachable(fleet: Fleet) -> None:
    await fleet.monitor.poll(KEY)
    await fleet.agents[DECODE].close()

    await fleet.monitor.poll(KEY)

    assert verdicts(fleet) == {PREFILL: Verdict.HEALTHY, DECODE: Verdict.UNREACHABLE}
    assert fleet.pokes == [KEY, KEY]
    await fleet.controller.reconcile(KEY)
    assert group_status(fleet, DECODE)["verdict"] == "Unreachable"


async def test_a_rank_whose_process_is_gone_makes_its_group_dead(fleet: Fleet) -> None:
    fleet.agents[DECODE].ranks = [rank(0), rank(1, alive=False)]
    await fleet.monitor.poll(KEY)
    assert verdicts(fleet)[DECODE] is Verdict.DEAD


def evidence_configmaps(fleet: Fleet) -> list[str]:
    return [cm["metadata"]["name"] for cm in fleet.kube.of_kind("ConfigMap", KEY[0])
            if (cm["metadata"].get("labels") or {}).get(restarts.EVIDENCE) == "true"]


async def test_ranks_that_exited_cleanly_make_their_group_stopped_never_dead_captured_or_restarted(
        fleet: Fleet) -> None:
    await fleet.monitor.poll(KEY)
    await fleet.controller.reconcile(KEY)
    fleet.kube.take_writes()
    # The engine was shut down on purpose: one rank gone after its goodbye, one still releasing its resources.
    fleet.agents[DECODE].ranks = [rank(0, phases.Phase.EXITED, alive=False), rank(1, phases.Phase.EXITED)]

    await fleet.monitor.poll(KEY)
    await fleet.controller.reconcile(KEY)
    await fleet.controller.reconcile(KEY)

    decode = fleet.monitor.health(KEY)[DECODE]
    assert (decode.verdict, decode.message) == (Verdict.STOPPED, "ranks 0,1: exited cleanly")
    assert group_status(fleet, DECODE)["verdict"] == "Stopped"
    assert fleet.events("GroupDead") == [] and fleet.events("GroupRestarted") == []
    assert evidence_configmaps(fleet) == []
    assert not [w for w in fleet.kube.take_writes() if w.verb == "delete"]


async def test_a_pod_deleted_while_its_agent_answers_makes_its_group_terminating_not_dead(fleet: Fleet) -> None:
    """The poll read the pods before the deletion and the answer after it, when the ranks had already gone:
    the answer is about the stop, so the group is judged with its pods as they are now."""
    await fleet.monitor.poll(KEY)
    await fleet.controller.reconcile(KEY)

    def delete() -> None:
        fleet.kube.update("Pod", KEY[0], PODS[DECODE],
                          lambda p: p["metadata"].update(deletionTimestamp="2026-11-30T12:00:00Z"))
    fleet.agents[DECODE].ranks = [rank(0), rank(1, phases.Phase.KV_POLL_ALL_REDUCE, alive=False)]
    fleet.agents[DECODE].on_ask = delete

    await fleet.monitor.poll(KEY)
    await fleet.controller.reconcile(KEY)

    decode = fleet.monitor.health(KEY)[DECODE]
    assert (decode.verdict, decode.message) == (Verdict.UNKNOWN, f"Terminating: pod(s) {PODS[DECODE]} going")
    assert asked(fleet, DECODE) == 2  # it was asked: the verdict is the re-check's, not a skipped poll's
    assert fleet.events("GroupDead") == [] and evidence_configmaps(fleet) == []
    assert group_status(fleet, DECODE)["verdict"] == "Unknown"


async def test_agents_of_a_group_not_ready_yet_are_not_asked(fleet: Fleet) -> None:
    fleet.ready(DECODE, False)

    await fleet.monitor.poll(KEY)

    assert asked(fleet, DECODE) == 0 and asked(fleet, PREFILL) == 1
    decode = fleet.monitor.health(KEY)[DECODE]
    assert decode.verdict is Verdict.UNKNOWN and decode.message.startswith("Starting: 0/1 pod(s) ready")


async def test_a_pool_whose_spec_cannot_be_read_is_looked_at_again_later_and_nothing_is_asked(
        fleet: Fleet) -> None:
    fleet.kube.update("InferencePool", *KEY, lambda p: p["spec"]["decode"].update(tp=3))  # 3 != 2 GPUs x 1 node

    assert await fleet.monitor.poll(KEY) == monitor_mod.IDLE_PERIOD
    assert (asked(fleet, PREFILL), asked(fleet, DECODE)) == (0, 0)
    assert fleet.pokes == []


async def test_a_pool_that_is_gone_ends_its_polls(fleet: Fleet) -> None:
    fleet.kube.remove("InferencePool", *KEY)
    assert await fleet.monitor.poll(KEY) is None


async def test_a_failing_after_poll_hook_does_not_stop_rank_health(fleet: Fleet) -> None:
    seen: list[dict[str, Verdict]] = []

    async def broken(key: PoolKey, spec: Any, observed: Any, judged: dict[str, GroupHealth]) -> None:
        seen.append({n: h.verdict for n, h in judged.items()})
        raise RuntimeError("a router client bug")

    fleet.monitor.after_poll = broken
    assert await fleet.monitor.poll(KEY) == HEARTBEAT_S
    assert seen == [{PREFILL: Verdict.HEALTHY, DECODE: Verdict.HEALTHY}] == [verdicts(fleet)]


async def test_a_desync_takes_the_group_out_of_its_routers_rotation_in_the_same_poll(fleet: Fleet) -> None:
    fleet.agents[DECODE].ranks = desynced(age_s=DESYNC_AFTER_S + 10)

    await fleet.monitor.poll(KEY)  # membership follows the verdicts (`after_poll`), no grace for a sick group

    assert fleet.router.urls() == {URLS[PREFILL]: "prefill"}
    assert [(m, p) for m, p, _ in fleet.router.changes()] == [("DELETE", "/workers/w2")]
    [event] = fleet.events("RouterWorkerRemoved")
    assert event["type"] == "Warning" and "Desync" in event["message"]


async def test_the_polling_task_follows_nudges_and_ends_with_its_pool(fleet: Fleet) -> None:
    fleet.monitor.watch(KEY)
    await fleet.agents[DECODE].wait_requests(1)  # the first poll comes at once
    fleet.monitor.nudge(KEY)  # the next long before its heartbeat
    await fleet.agents[DECODE].wait_requests(2)
    [task] = [t for t in asyncio.all_tasks() if t.get_name() == f"rank-health {KEY[0]}/{KEY[1]}"]

    fleet.kube.remove("InferencePool", *KEY)
    fleet.monitor.nudge(KEY)
    await asyncio.wait_for(task, timeout=5)  # the task sees the pool gone and ends by itself
    assert fleet.monitor.health(KEY) == {}
