"""What each rollout and health field changes in the planner's decisions (see test_api_field_effects)."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.operator.api.health import HealthSpec
from pdfleet.operator.api.status import Verdict
from pdfleet.operator.cache import Cache
from pdfleet.operator.engines import evidence as evidence_mod
from pdfleet.operator.engines.monitor import HealthMonitor
from pdfleet.operator.planning.health.rank_health import judge_group
from pdfleet.runtime.health import phases
from tests.support.pools import pool_body
from tests.unit.test_planning import FakeCluster, replaced_roles
from tests.unit.test_rank_health import answer, pod, rank
from tests.unit.test_restarts import DESYNC, at, cluster_with, pods_deleted, step

P = phases.Phase


# ---- rollout ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("prefill", "decode"), [(2, 1), (1, 3)])
@pytest.mark.parametrize("order", ["DecodeFirst", "PrefillFirst"])
@pytest.mark.effect("spec.rollout.maxUnavailable.prefill", "spec.rollout.maxUnavailable.decode")
def test_max_unavailable_is_how_many_groups_of_each_role_one_step_replaces_after_the_canary(
        prefill: int, decode: int, order: str) -> None:
    cluster = FakeCluster(pool_body(prefill=3, decode=3))
    cluster.pool["spec"]["rollout"] = {"maxUnavailable": {"prefill": prefill, "decode": decode}, "order": order,
                                       "verification": {"bake": "0s"}, "postRolloutWatch": "0s"}
    cluster.converge()
    cluster.pool["spec"]["engine"]["overlapSchedule"] = "Disabled"
    first = "decode" if order == "DecodeFirst" else "prefill"
    widest = decode if first == "decode" else prefill

    steps = [replaced_roles(p) for p in cluster.converge(limit=30)]
    replacing = [s for s in steps if s]
    assert replacing[0] == [first], "the role's canary goes alone, whatever maxUnavailable allows"
    assert replacing[1] == [first] * min(widest, 2), "then up to maxUnavailable at once (2 groups are left)"
    assert {r for s in replacing[:2] for r in s} == {first}, "the other role waits for the first"
    assert cluster.pool["status"]["phase"] == "Ready"


# ---- rank health ------------------------------------------------------------------------------------------

def verdict_with(health: dict[str, Any], *ranks: Any) -> Verdict:
    spec = HealthSpec.model_validate({"heartbeatPeriod": "1s", **health})
    return judge_group(spec, tp=2, gpus_per_node=2, nodes=1, pods=[pod()], answers={"g-0": answer(*ranks)},
                       answered_before=False).verdict


@pytest.mark.effect("spec.health.desyncAfter")
def test_ranks_apart_for_3s_are_desync_only_past_desync_after() -> None:
    apart = (rank(0, P.RECV_BROADCAST, age_s=3, collectives=11), rank(1, P.KV_POLL_ALL_REDUCE, age_s=3))
    assert verdict_with({"desyncAfter": "2s"}, *apart) is Verdict.DESYNC
    assert verdict_with({"desyncAfter": "4s"}, *apart) is Verdict.HEALTHY


@pytest.mark.effect("spec.health.hangAfter")
def test_ranks_blocked_together_for_5s_are_a_hang_only_past_hang_after() -> None:
    blocked = (rank(0, P.RECV_BROADCAST, age_s=5), rank(1, P.RECV_BROADCAST, age_s=5))
    assert verdict_with({"hangAfter": "4s"}, *blocked) is Verdict.HANG
    assert verdict_with({"hangAfter": "6s"}, *blocked) is Verdict.HEALTHY


class NoAgents:
    """A pool without pods has no agent to ask; asking one would be a bug."""

    async def ranks_all(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no agent should be asked")


@pytest.mark.parametrize(("health", "period"), [({}, 5.0), ({"heartbeatPeriod": "2s"}, 2.0)])
@pytest.mark.effect("spec.health.heartbeatPeriod")
async def test_the_monitor_polls_a_pool_every_heartbeat_period(health: dict[str, Any], period: float) -> None:
    body = pool_body(health=health)
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    monitor = HealthMonitor(cache=Cache(pools={key: [body]}, owned=[]), engines=NoAgents(),  # type: ignore[arg-type]
                            poke=lambda _: None)
    assert await monitor.poll(key) == period


# ---- evidence ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("records", "stacks"), [(True, False), (False, True)])
@pytest.mark.effect("spec.health.evidence.rankRecords", "spec.health.evidence.stacks")
def test_evidence_asks_for_what_is_switched_on_and_keeps_only_that(records: bool, stacks: bool) -> None:
    cluster = cluster_with(evidence={"rankRecords": records, "stacks": stacks})

    [request] = step(cluster, DESYNC, at(0), capture=False).capture

    assert (request.records, request.stacks) == (records, stacks)
    data = evidence_mod.data_of(request, [("tiny-decode-0-0", {"ranks": []}, {"ranks": []})])
    assert ("tiny-decode-0-0.ranks.json" in data, "tiny-decode-0-0.stacks.json" in data) == (records, stacks)


@pytest.mark.effect("spec.health.evidence.rankRecords", "spec.health.evidence.stacks")
def test_with_neither_records_nor_stacks_no_evidence_is_captured_and_the_restart_is_not_held() -> None:
    cluster = cluster_with(evidence={"rankRecords": False, "stacks": False})

    plan = step(cluster, DESYNC, at(0))

    assert plan.capture == () and pods_deleted(plan) == ["tiny-decode-0-0"]
