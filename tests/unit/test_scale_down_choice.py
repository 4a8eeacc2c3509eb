"""Which group a scale-down removes (planning/scale/ordinals.py), through the real planner: the one with the least work,
the others keeping their names, and a scale-up after it filling the gap without reusing a terminating name."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any

import pytest

from pdfleet.operator.api import checks
from pdfleet.operator.api.roles import Role
from pdfleet.operator.planning import reconcile, status_writes
from pdfleet.operator.planning.plan import Plan
from pdfleet.operator.planning.scale import ordinals
from pdfleet.operator.planning.scale.engine_load import EngineLoad, Work
from tests.support.pools import pool_body
from tests.unit.test_planning import NOW, FakeCluster, reasons


class LoadedCluster(FakeCluster):
    """The fake cluster with the health monitor's last reading of each group's load."""

    def __init__(self, pool: dict[str, Any], *, work: Work | None = None) -> None:
        super().__init__(pool)
        self.work = work

    def plan(self, now: datetime.datetime = NOW) -> Plan:
        health, engines = self.answers()
        return reconcile.plan(self.pool, self.observed(), now=now, health=health, engines=engines, work=self.work)

    def step(self, now: datetime.datetime = NOW) -> Plan:
        plan = self.plan(now)
        self.apply(plan)
        return plan


def loads(**running: float) -> Work:
    """Work with every named group asked and its running requests; `decode_1=4` names tiny-decode-1."""
    named = {f"tiny-{k.replace('_', '-')}": EngineLoad(running=v) for k, v in running.items()}
    return Work(loads=named, asked=frozenset(named))


def scale(cluster: FakeCluster, role: str, replicas: int) -> list[Plan]:
    cluster.pool["spec"][role]["replicas"] = replicas
    cluster.pool["metadata"]["generation"] = cluster.pool["metadata"].get("generation", 1) + 1
    return cluster.converge()


def decode_groups(cluster: FakeCluster) -> list[str]:
    return sorted({name.rsplit("-", 1)[0] for kind, name in cluster.owned if kind == "Pod" and "-decode-" in name})


def test_a_scale_down_removes_the_group_with_the_least_work_and_the_others_keep_their_names() -> None:
    cluster = LoadedCluster(pool_body(decode=3))
    cluster.converge()
    uids = {n: o["metadata"]["uid"] for (k, n), o in cluster.owned.items() if k == "Pod"}
    cluster.work = loads(decode_0=5, decode_1=0, decode_2=7)
    plans = scale(cluster, "decode", 2)
    assert decode_groups(cluster) == ["tiny-decode-0", "tiny-decode-2"]
    deleted = [e.message for p in plans for e in p.events if e.reason == "GroupDeleted"]
    assert deleted == ["deleted group tiny-decode-1: scaled down"]
    for name in ("tiny-decode-0-0", "tiny-decode-2-0"):
        assert cluster.owned[("Pod", name)]["metadata"]["uid"] == uids[name], "a group that stays is never replaced"
    assert [g["name"] for g in cluster.pool["status"]["groups"] if g["role"] == "decode"] == \
        ["tiny-decode-0", "tiny-decode-2"]
    assert cluster.pool["status"]["decode"]["desired"] == 2
    # Planned again with other loads: the choice is made; nothing moves.
    cluster.work = loads(decode_0=9, decode_1=0, decode_2=0)
    assert cluster.step().empty


def test_without_any_load_known_the_highest_group_goes_as_before() -> None:
    cluster = LoadedCluster(pool_body(decode=3), work=Work())
    cluster.converge()
    cluster.work = Work(asked=frozenset({"tiny-decode-0", "tiny-decode-1", "tiny-decode-2"}))  # none answered
    scale(cluster, "decode", 1)
    assert decode_groups(cluster) == ["tiny-decode-0"]


def test_a_scale_down_waits_for_the_load_of_serving_groups_not_yet_asked() -> None:
    cluster = LoadedCluster(pool_body(decode=2), work=Work())
    cluster.converge()
    cluster.pool["spec"]["decode"]["replicas"] = 1
    cluster.pool["metadata"]["generation"] = 2
    waiting = cluster.step()
    assert not any(ref.kind == "Pod" for ref in waiting.delete), "no group goes before its load was asked"
    assert waiting.requeue_after is not None and waiting.requeue_after > 0
    cluster.work = loads(decode_0=3, decode_1=1)
    cluster.converge()
    assert decode_groups(cluster) == ["tiny-decode-0"], "the group running fewer requests went"


def test_a_group_that_does_not_serve_goes_before_any_serving_one_whatever_their_load() -> None:
    cluster = LoadedCluster(pool_body(decode=3))
    cluster.converge()
    pod = cluster.owned[("Pod", "tiny-decode-0-0")]
    pod["status"]["conditions"][0]["status"] = "False"  # its engine stopped answering its readiness probe
    cluster.work = loads(decode_0=0, decode_1=0, decode_2=0)
    cluster.pool["spec"]["decode"]["replicas"] = 2
    cluster.pool["metadata"]["generation"] = 2
    plan = cluster.step()
    assert sorted(ref.name for ref in plan.delete if ref.kind == "Pod") == ["tiny-decode-0-0"]


def test_a_scale_up_after_a_scale_down_fills_the_lowest_free_ordinal_not_a_terminating_one() -> None:
    cluster = LoadedCluster(pool_body(decode=3))
    cluster.converge()
    cluster.work = loads(decode_0=0, decode_1=4, decode_2=4)
    cluster.pool["spec"]["decode"]["replicas"] = 2
    cluster.pool["metadata"]["generation"] = 2
    plan = cluster.plan()
    assert [ref.name for ref in plan.delete if ref.kind == "Pod"] == ["tiny-decode-0-0"]
    # The deletion is under way (the pod drains for its grace period) when the role is scaled up again.
    cluster.apply(dataclasses.replace(plan, delete=()))
    terminating = cluster.owned[("Pod", "tiny-decode-0-0")]
    terminating["metadata"]["deletionTimestamp"] = "2026-11-30T12:00:00Z"
    cluster.pool["spec"]["decode"]["replicas"] = 3
    cluster.pool["metadata"]["generation"] = 3
    plan = cluster.step()
    created = sorted(o["metadata"]["name"] for o in plan.apply if o["kind"] == "Pod")
    assert created == ["tiny-decode-3-0"], "a new group does not wait for the terminating one of its name"


def test_a_surge_group_of_a_rollout_is_adopted_as_a_replica_by_a_scale_up() -> None:
    pool = pool_body(decode=2)
    pool["spec"]["rollout"] = {"maxSurge": {"decode": 1}}
    cluster = LoadedCluster(pool)
    cluster.converge()
    previous = copy.deepcopy(cluster.pool["status"])
    previous["decode"]["surge"] = 1
    previous["groups"].append({**previous["groups"][-1], "name": "tiny-decode-2"})
    pods = {"tiny-decode-2": [{"metadata": {"name": "tiny-decode-2-0", "labels": {}}}]}
    spec, _ = checks.validate_pool(cluster.pool)
    assert spec is not None
    got = ordinals.slots("tiny", spec.model_copy(update={"decode": spec.decode.model_copy(update={"replicas": 3})}),
                         pods, status_writes.parse_status(previous))
    assert got[Role.DECODE].base == (0, 1, 2)


@pytest.mark.parametrize(("name", "want"), [("tiny-decode-3", 3), ("tiny-decode-03", None), ("tiny-decode-x", None),
                                        ("tiny-prefill-3", None), ("tiny-decode-", None)])
def test_ordinal_reads_only_the_names_the_renderer_gives(name: str, want: int | None) -> None:
    assert ordinals.ordinal("tiny", Role.DECODE, name) == want


def test_scaling_events_still_say_so() -> None:
    cluster = LoadedCluster(pool_body(decode=2))
    cluster.converge()
    cluster.work = loads(decode_0=1, decode_1=2)
    assert "Scaled" in reasons(scale(cluster, "decode", 1))
