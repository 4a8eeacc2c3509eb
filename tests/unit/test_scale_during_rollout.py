"""A scale while a rollout is under way (issue 25): it neither restarts the rollout nor replaces a group twice, and
the groups it adds start at the revision being rolled out. The planner walked whole on a fake cluster, the pool's
replicas changed as the InferencePoolRole mirror writes them (a spec change that keeps the revision)."""

from __future__ import annotations

import collections

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.planning import patch_set
from pdfleet.operator.planning.plan import Plan
from pdfleet.operator.render.revision import role_revision
from tests.support.pools import NO_BAKE, pool_body
from tests.unit.test_planning import FakeCluster
from tests.unit.test_verification import disable_overlap


def _rolling() -> tuple[FakeCluster, list[Plan]]:
    """overlapSchedule: Disabled rolling out over 1 prefill and 2 decode groups, its first new group not verified
    yet (its agents do not answer)."""
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=1, decode=2))
    cluster.converge()
    cluster.engines = False
    disable_overlap(cluster)
    cluster.pool["metadata"]["generation"] += 1
    plans = [cluster.step() for _ in range(3)]
    status = cluster.pool["status"]
    assert status["currentRevision"] != status["updateRevision"], "the rollout is under way"
    return cluster, plans


def _scale(cluster: FakeCluster, decode: int) -> None:
    cluster.pool["spec"]["decode"]["replicas"] = decode
    cluster.pool["metadata"]["generation"] += 1


def _wanted(cluster: FakeCluster, role: Role) -> str:
    """The revision the spec asks of `role`'s groups (a group's status and pods carry their role's revision)."""
    spec, _ = patch_set.validated(cluster.pool)
    assert spec is not None
    return role_revision(spec, role)


def _deleted(plans: list[Plan]) -> collections.Counter[str]:
    return collections.Counter(ref.name for plan in plans for ref in plan.delete if ref.kind == "Pod")


@pytest.mark.parametrize("decode", [3, 1])
def test_a_scale_mid_rollout_replaces_no_group_twice_and_the_rollout_completes(decode: int) -> None:
    cluster, plans = _rolling()
    update = cluster.pool["status"]["updateRevision"]
    _scale(cluster, decode)
    plans.append(cluster.step())
    assert cluster.pool["status"]["updateRevision"] == update, "a scale keeps the revision being rolled out"
    cluster.engines = True
    plans += cluster.converge(limit=40)

    status = cluster.pool["status"]
    assert status["currentRevision"] == status["updateRevision"] == update
    verified = {c["type"]: c["status"] for c in status["conditions"]}["RolloutVerified"]
    assert verified == "True"
    groups = {g["name"]: g for g in status["groups"]}
    assert sorted(groups) == sorted(["tiny-prefill-0", *(f"tiny-decode-{i}" for i in range(decode))])
    assert all(g["revision"] == _wanted(cluster, Role(g["role"])) for g in groups.values()), groups
    assert all(count == 1 for count in _deleted(plans).values()), _deleted(plans)
    assert status["decode"]["desired"] == status["decode"]["ready"] == decode


def test_a_group_added_mid_rollout_is_created_at_the_update_revision_and_never_replaced() -> None:
    cluster, plans = _rolling()
    update = cluster.pool["status"]["updateRevision"]
    _scale(cluster, 3)
    cluster.engines = True
    plans += cluster.converge(limit=40)
    created = [obj for plan in plans for obj in plan.apply
               if obj["kind"] == "Pod" and obj["metadata"]["name"].startswith("tiny-decode-2-")]
    assert created and all(o["metadata"]["labels"]["pdfleet.dev/revision"] == _wanted(cluster, Role.DECODE)
                           for o in created)
    assert cluster.pool["status"]["updateRevision"] == update
    assert "tiny-decode-2-0" not in _deleted(plans)
