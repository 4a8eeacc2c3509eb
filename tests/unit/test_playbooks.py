"""The overlap-desync playbook: the decision (table of states -> what the operator does), and its whole walk through
the real planner: a Desync on the overlap loop becomes one patch of overlapSchedule and a verified rollout to the
normal loop, once; a spec that sets it back is left as it is and said once; removing the annotation re-arms it."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import pytest

from pdfleet.operator.api import checks
from pdfleet.operator.api.status import GroupStatus, Verdict
from pdfleet.operator.planning import reconcile, spec_change
from pdfleet.operator.planning.health import playbooks
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.plan import Plan, Restart
from pdfleet.operator.planning.rollout import rollback
from tests.support.pools import NO_BAKE, pool_body
from tests.unit.test_planning import NOW, FakeCluster
from tests.unit.test_verification import NORMAL_DECODE, OVERLAP_DECODE, condition

Body = dict[str, Any]
GROUP = "tiny-decode-0"
EVIDENCE = f"{GROUP}-evidence-1"
ON = {"overlapDesync": {"action": "DisableOverlapSchedule"}}
DIVERGED = "ranks diverged for 3.0s: rank 0 in recv_broadcast at collective 11 (iteration 5)"

pytestmark = pytest.mark.effect("spec.rollout.playbooks.overlapDesync.action")


def at(seconds: float) -> datetime.datetime:
    return NOW + datetime.timedelta(seconds=seconds)


def armed_cluster(*, playbook: Body | None = None) -> FakeCluster:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=1, decode=2,
                                    rollout__playbooks=ON if playbook is None else playbook))
    cluster.converge()
    return cluster


def desync(cluster: FakeCluster, now: datetime.datetime, *, loop: str = OVERLAP_DECODE) -> Plan:
    """One reconcile in which GROUP's ranks are in Desync on `loop` (the others healthy); evidence requests are
    fulfilled the way the executor would (a ConfigMap appears)."""
    health, engines = cluster.answers()
    health[GROUP] = GroupHealth(Verdict.DESYNC, loop, DIVERGED, 1, answered=True)
    plan = reconcile.plan(cluster.pool, cluster.observed(), now=now, health=health, engines=engines)
    cluster.apply(plan)
    for request in plan.capture:
        cluster.owned[("ConfigMap", request.metadata["name"])] = {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": copy.deepcopy(request.metadata), "data": {}}
    return plan


def desync_until_restarted(cluster: FakeCluster, start: float, *, loop: str = OVERLAP_DECODE) -> list[Plan]:
    """Desync reconciles until the group is restarted (evidence first): the plans."""
    plans = []
    for i in range(4):
        plans.append(desync(cluster, at(start + i), loop=loop))
        if plans[-1].restarted:
            return plans
    raise AssertionError(f"{GROUP} was never restarted: {plans[-1]}")


def record(cluster: FakeCluster) -> Body | None:
    raw = (cluster.pool["metadata"].get("annotations") or {}).get(playbooks.OVERLAP_DESYNC)
    return json.loads(raw) if raw else None


def reasons(plans: list[Plan], reason: str) -> list[str]:
    return [e.message for p in plans for e in p.events if e.reason == reason]


def without_overlap(spec: Body) -> Body:
    out = copy.deepcopy(spec)
    out["engine"].pop("overlapSchedule", None)
    return out


# --- the walk through the planner ------------------------------------------------------------------------------


def test_an_overlap_desync_restarts_the_group_and_rolls_out_the_normal_loop_verified_once() -> None:
    cluster = armed_cluster()
    before = copy.deepcopy(cluster.pool)

    plans = desync_until_restarted(cluster, 0)

    restart = plans[-1]
    assert [r.group for r in restart.restarted] == [GROUP]
    assert [p.pool_changes for p in plans[:-1]] == [()], "nothing is patched before the evidence is in"
    [change] = [c for c in restart.pool_changes if c.changes_spec]
    assert change.ops[0] == {"op": "test", "path": "/metadata/generation", "value": 1}
    # Only that field changed: everything else of the spec is the person's.
    assert cluster.pool["spec"]["engine"]["overlapSchedule"] == "Disabled"
    assert without_overlap(cluster.pool["spec"]) == without_overlap(before["spec"])
    assert cluster.pool["metadata"]["generation"] == 2
    assert record(cluster) == {"at": "2026-11-30T12:00:01Z", "group": GROUP, "event_loop": OVERLAP_DECODE,
                               "evidence": EVIDENCE, "generation": 2, "reverted": None}
    [message] = reasons([restart], "PlaybookOverlapDesync")
    assert GROUP in message and f"evidence in ConfigMap {EVIDENCE}" in message and "remove the annotation" in message

    # The new spec rolls out like any other: every group replaced and verified on the normal loop.
    plans = cluster.converge(limit=20)
    status = cluster.pool["status"]
    assert condition(cluster, "RolloutVerified")["status"] == "True"
    assert status["currentRevision"] == status["updateRevision"]
    assert {g["eventLoop"] for g in status["groups"] if g["role"] == "decode"} == {NORMAL_DECODE}
    assert all(g["verifiedRevision"] == g["revision"] for g in status["groups"])
    assert reasons(plans, "PlaybookOverlapDesync") == []

    # A second overlap desync (whatever its cause) is restarted as usual; the playbook does not fire again.
    again = desync_until_restarted(cluster, 600)
    assert reasons(again, "PlaybookOverlapDesync") == [] and all(not c.changes_spec for p in again
                                                                 for c in p.pool_changes)
    assert cluster.pool["metadata"]["generation"] == 2


def test_a_spec_set_back_is_not_flipped_again_and_the_disagreement_is_said_once() -> None:
    cluster = armed_cluster()
    desync_until_restarted(cluster, 0)
    cluster.converge(limit=20)

    # A GitOps tool re-applies what git says: overlapSchedule unset (Enabled); annotations it does not own stay.
    cluster.pool["spec"]["engine"].pop("overlapSchedule")
    cluster.pool["metadata"]["generation"] += 1
    plans = cluster.converge(limit=20)

    assert "overlapSchedule" not in cluster.pool["spec"]["engine"]
    [message] = reasons(plans, "PlaybookOverlapDesyncReverted")
    assert message.startswith("spec.engine.overlapSchedule is Enabled again at generation 3, reverted by someone")
    assert GROUP in message and EVIDENCE in message and "commit overlapSchedule: Disabled to git" in message
    assert record(cluster)["reverted"] == 3
    status = cluster.pool["status"]
    assert condition(cluster, "RolloutVerified")["status"] == "True" and \
        status["currentRevision"] == status["updateRevision"]
    assert {g["eventLoop"] for g in status["groups"] if g["role"] == "decode"} == {OVERLAP_DECODE}

    # The next overlap desync is restarted, but the spec stays as the person (or git) says, and nothing is said
    # again: no tug of war.
    again = desync_until_restarted(cluster, 600)
    again += cluster.converge(limit=20)
    assert cluster.pool["metadata"]["generation"] == 3 and "overlapSchedule" not in cluster.pool["spec"]["engine"]
    assert reasons(again, "PlaybookOverlapDesync") == reasons(again, "PlaybookOverlapDesyncReverted") == []


def test_removing_the_annotation_re_arms_the_playbook() -> None:
    cluster = armed_cluster()
    desync_until_restarted(cluster, 0)
    cluster.converge(limit=20)
    cluster.pool["spec"]["engine"]["overlapSchedule"] = "Enabled"
    cluster.pool["metadata"]["generation"] += 1
    cluster.converge(limit=20)
    del cluster.pool["metadata"]["annotations"][playbooks.OVERLAP_DESYNC]  # a person resets it

    plans = desync_until_restarted(cluster, 600)

    assert len(reasons(plans, "PlaybookOverlapDesync")) == 1
    assert cluster.pool["spec"]["engine"]["overlapSchedule"] == "Disabled"
    assert record(cluster)["at"] == "2026-11-30T12:10:01Z" and record(cluster)["generation"] == 4


@pytest.mark.parametrize(("playbook", "loop"), [({}, OVERLAP_DECODE), (ON, NORMAL_DECODE)],
                         ids=["action-None", "normal-loop"])
def test_the_playbook_does_not_fire_without_its_action_or_for_a_normal_loop(playbook: Body, loop: str) -> None:
    cluster = armed_cluster(playbook=playbook)

    plans = desync_until_restarted(cluster, 0, loop=loop)

    assert [r.group for r in plans[-1].restarted] == [GROUP], "restarted as any Desync"
    assert record(cluster) is None and cluster.pool["metadata"]["generation"] == 1
    assert reasons(plans, "PlaybookOverlapDesync") == []


# --- the decision (table) ---------------------------------------------------------------------------------------


def _group(loop: str | None = OVERLAP_DECODE) -> GroupStatus:
    return GroupStatus.model_validate({"name": GROUP, "role": "decode", "revision": "r1", "eventLoop": loop,
                                       "verdict": "Desync"})


def _evidence_cm(n: int, verdict: str) -> Body:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": f"{GROUP}-evidence-{n}", "labels": {"pdfleet.dev/evidence": "true", "pdfleet.dev/group": GROUP},
        "annotations": {"pdfleet.dev/evidence-verdict": verdict}}}


FIRED = playbooks.OverlapDesyncRecord(at="2026-11-30T11:00:00Z", group=GROUP, event_loop=OVERLAP_DECODE,
                                      evidence=EVIDENCE, generation=1)
DESYNC_RESTART = Restart(GROUP, "Desync", (("Pod", f"{GROUP}-0"),))


@pytest.mark.parametrize(("action", "overlap", "annotation", "restarted", "loop", "spec_changing", "reason"), [
    ("DisableOverlapSchedule", None, None, DESYNC_RESTART, OVERLAP_DECODE, False, "PlaybookOverlapDesync"),
    ("None", None, None, DESYNC_RESTART, OVERLAP_DECODE, False, None),
    ("DisableOverlapSchedule", None, None, DESYNC_RESTART, NORMAL_DECODE, False, None),
    ("DisableOverlapSchedule", None, None, DESYNC_RESTART, None, False, None),
    ("DisableOverlapSchedule", None, None, Restart(GROUP, "Hang", ()), OVERLAP_DECODE, False, None),
    ("DisableOverlapSchedule", None, None, None, OVERLAP_DECODE, False, None),
    ("DisableOverlapSchedule", "Disabled", None, DESYNC_RESTART, OVERLAP_DECODE, False, None),
    ("DisableOverlapSchedule", None, None, DESYNC_RESTART, OVERLAP_DECODE, True, None),
    ("DisableOverlapSchedule", "Disabled", FIRED, DESYNC_RESTART, OVERLAP_DECODE, False, None),
    ("DisableOverlapSchedule", "Enabled", FIRED, DESYNC_RESTART, OVERLAP_DECODE, False,
     "PlaybookOverlapDesyncReverted"),
    ("DisableOverlapSchedule", None, FIRED, None, OVERLAP_DECODE, False, "PlaybookOverlapDesyncReverted"),
    ("DisableOverlapSchedule", None, FIRED.model_copy(update={"reverted": 2}), DESYNC_RESTART, OVERLAP_DECODE, False,
     None),
    ("DisableOverlapSchedule", None, "not json", DESYNC_RESTART, OVERLAP_DECODE, False, None),
    ("None", "Enabled", FIRED, None, OVERLAP_DECODE, False, None),
], ids=["fires", "action-None", "normal-loop", "loop-unknown", "hang-not-desync", "not-restarted-yet",
        "already-disabled", "a-rollback-patches-the-spec", "fired-and-kept", "fired-then-reverted",
        "fired-then-unset", "revert-already-said", "unreadable-record-counts-as-fired", "reverted-action-None"])
def test_what_the_overlap_desync_playbook_does(action: str, overlap: str | None,
                                               annotation: playbooks.OverlapDesyncRecord | str | None,
                                               restarted: Restart | None, loop: str | None, spec_changing: bool,
                                               reason: str | None) -> None:
    pool = pool_body(prefill=1, decode=1, generation=2, rollout__playbooks={"overlapDesync": {"action": action}})
    if overlap is not None:
        pool["spec"]["engine"]["overlapSchedule"] = overlap
    if annotation is not None:
        value = annotation if isinstance(annotation, str) else annotation.model_dump_json()
        pool["metadata"]["annotations"] = {playbooks.OVERLAP_DESYNC: value}
    spec, problems = checks.validate_pool(pool)
    assert spec is not None and not problems
    configmaps = [_evidence_cm(1, "Desync"), _evidence_cm(2, "Hang")]

    decision = playbooks.decide(pool, spec, [_group(loop)], [restarted] if restarted else [], configmaps, at(5),
                                spec_changing=spec_changing)

    assert (decision.event.reason if decision else None) == reason
    if decision is None:
        return
    assert decision.event.type == "Warning" and decision.event.about == (("InferencePool", "tiny"),)
    assert decision.change.ops[0] == {"op": "test", "path": "/metadata/generation", "value": 2}
    written = json.loads(spec_change.apply(pool, decision.change)["metadata"]["annotations"][playbooks.OVERLAP_DESYNC])
    if reason == "PlaybookOverlapDesync":
        assert decision.change.changes_spec and EVIDENCE in decision.event.message
        assert written == {"at": "2026-11-30T12:00:05Z", "group": GROUP, "event_loop": OVERLAP_DECODE,
                           "evidence": EVIDENCE, "generation": 3, "reverted": None}, "the Desync bundle, not Hang's"
    else:
        assert not decision.change.changes_spec, "a reverted fix is never flipped again"
        assert written == {**FIRED.model_dump(), "reverted": 2}


def test_a_revert_by_autorollback_says_so() -> None:
    pool = pool_body(prefill=1, decode=1, generation=3, rollout__playbooks=ON)
    gone_back = rollback.RolledBack(cause="GateFailed", from_revision="r2", to_revision="r1", generation=3,
                                    message="m", at="2026-11-30T11:30:00Z")
    pool["metadata"]["annotations"] = {playbooks.OVERLAP_DESYNC: FIRED.model_dump_json(),
                                       rollback.ROLLED_BACK: gone_back.model_dump_json()}
    spec, _ = checks.validate_pool(pool)
    assert spec is not None

    decision = playbooks.decide(pool, spec, [], [], [], NOW)

    assert decision is not None and "reverted by the operator's autoRollback" in decision.event.message
