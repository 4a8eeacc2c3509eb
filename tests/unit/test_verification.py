"""Verified rollouts: the gate functions (`planning.rollout.verification`) and the planner's rollout decisions as a
table of states -> next step, walked with `FakeCluster` (engines answer the gates as rendered unless a test says
otherwise)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from pdfleet.operator.api import checks
from pdfleet.operator.api.flags import MANAGED_FLAGS
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.rollout import VerificationSpec
from pdfleet.operator.api.status import GateState, Verdict
from pdfleet.operator.planning import reconcile
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.plan import Plan
from pdfleet.operator.planning.rollout import verification
from pdfleet.operator.planning.rollout.verification import EngineFacts
from pdfleet.operator.render import engine_args, labels
from tests.support import server_args
from tests.support.pools import NO_BAKE, pool_body
from tests.unit.test_planning import NOW, FakeCluster, replaced_roles

# toolCallCanary: switched off by default; bake: not for a first revision (nor with NO_BAKE)
CANARY = {"toolCallCanary": "Skipped", "bake": "Skipped"}

Body = dict[str, Any]
OVERLAP_DECODE = "event_loop_overlap_disagg_decode"
NORMAL_DECODE = "event_loop_normal_disagg_decode"


def spec_of(pool: Body) -> Any:
    spec, problems = checks.validate_pool(pool)
    assert spec is not None and not problems
    return spec


def condition(cluster: FakeCluster, type_: str) -> Body:
    return next(c for c in cluster.pool["status"]["conditions"] if c["type"] == type_)


def group(cluster: FakeCluster, name: str) -> Body:
    return next(g for g in cluster.pool["status"]["groups"] if g["name"] == name)


def gates(cluster: FakeCluster, name: str) -> dict[str, str]:
    return {g["name"]: g["state"] for g in (group(cluster, name).get("verification") or {}).get("gates", [])}


def events(plans: list[Plan], reason: str) -> list[str]:
    return [e.message for p in plans for e in p.events if e.reason == reason]


def disable_overlap(cluster: FakeCluster) -> None:
    cluster.pool["spec"]["engine"]["overlapSchedule"] = "Disabled"


# --- the gate functions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("overlap", "role", "loop"), [
    ("Enabled", Role.DECODE, OVERLAP_DECODE),
    ("Disabled", Role.DECODE, NORMAL_DECODE),
    ("Enabled", Role.PREFILL, "event_loop_overlap_disagg_prefill"),
    ("Disabled", Role.PREFILL, "event_loop_normal_disagg_prefill"),
])
def test_the_expected_loop_is_the_one_sglang_dispatches_for_the_role_and_overlap_switch(
        overlap: str, role: Role, loop: str) -> None:
    assert verification.expected_event_loop(spec_of(pool_body(engine__overlapSchedule=overlap)), role) == loop


def test_every_managed_flag_is_compared_or_has_a_reason_not_to_be() -> None:
    assert set(verification.SERVER_ARG_FIELDS) | set(verification.NOT_COMPARED) == set(MANAGED_FLAGS)
    assert not set(verification.SERVER_ARG_FIELDS) & set(verification.NOT_COMPARED)


def test_the_compared_fields_are_sglang_server_args_fields() -> None:
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", "dummy"])
    missing = {f for f in verification.SERVER_INFO_FIELDS if not hasattr(args, f)}
    assert not missing


@pytest.mark.parametrize("updates", [
    {},
    {"engine__overlapSchedule": "Disabled", "engine__tokenizerBatchDecode": "Disabled"},
    {"decode__dp": 2, "decode__tp": 2, "decode__gpusPerNode": 2, "model__trustRemoteCode": True},
])
def test_sglangs_own_resolved_server_args_pass_the_gate_for_what_the_operator_renders(updates: Body) -> None:
    # The simulator's /server_info is SGLang's prepare_server_args + resolve_once on the command line; the fakes
    # of planner tests (tests.support.server_args) must read that command line as SGLang does.
    from pdfleet.runtime.simulator.info import resolve_server_args

    spec = spec_of(pool_body(**updates))
    for role in Role:
        flags = engine_args.managed_flags(spec, role)
        expected = verification.expected_server_args(flags)
        resolved = resolve_server_args(engine_args.command_line(spec, flags))
        assert verification.server_args_mismatches(expected, resolved) == []
        assert server_args.shown(engine_args.command_line(spec, flags)) == expected


def test_server_args_that_differ_are_named_with_expected_and_seen() -> None:
    expected = verification.expected_server_args([("--tp-size", "2"), ("--disable-overlap-schedule", None),
                                                  ("--port", "30000")])
    assert expected == {"tp_size": 2, "disable_overlap_schedule": True, "port": 30000,
                        "disable_tokenizer_batch_decode": False}
    seen = {"tp_size": "2", "disable_overlap_schedule": False, "port": 30000}
    assert verification.server_args_mismatches(expected, seen) == [
        "disable_overlap_schedule: expected True, seen False",
        "disable_tokenizer_batch_decode: expected False, not reported",
    ]


def _ready_pod(uid: str, *, revision: str = "r2", since: str = "2026-11-30T12:00:00Z") -> Body:
    return {"metadata": {"name": f"p-{uid}", "uid": uid,
                         "labels": {labels.REVISION: revision, labels.RANK: "0"}},
            "spec": {"containers": [{"args": ["--", "--tp-size", "1"]}]},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": since}]}}


def _verify(pod: Body, *, health: GroupHealth | None, facts: EngineFacts | None, now: datetime.datetime = NOW,
            policy: VerificationSpec | None = None) -> verification.Outcome:
    return verification.verify(policy or VerificationSpec(), role=Role.DECODE, expected_loop=NORMAL_DECODE,
                               revision="r2", ready=True, want_flags=[("--tp-size", "1")], pods=[pod], before=None,
                               health=health, facts=facts, now=now)


HEALTHY_NORMAL = GroupHealth(Verdict.HEALTHY, NORMAL_DECODE, "", 1, answered=True, patch_sets=frozenset({()}))
INFO = {"tp_size": 1, "disable_overlap_schedule": False, "disable_tokenizer_batch_decode": False}


@pytest.mark.effect("spec.rollout.verification.eventLoop", "spec.rollout.verification.serverArgs")
@pytest.mark.parametrize(("health", "facts_pods", "info", "policy", "states"), [
    (HEALTHY_NORMAL, {"u1"}, INFO, {}, ("Passed", "Passed")),
    # What the monitor judged of other pods (the group's old ones) is never taken for these.
    (HEALTHY_NORMAL, {"u0"}, INFO, {}, ("Waiting", "Waiting")),
    (None, {"u1"}, None, {}, ("Waiting", "Waiting")),
    (dataclasses.replace(HEALTHY_NORMAL, event_loop=None), {"u1"}, INFO, {}, ("Waiting", "Passed")),
    # Every rank reports, not the same loop: half switched, which no wait mends.
    (dataclasses.replace(HEALTHY_NORMAL, event_loop=None, loops=frozenset({NORMAL_DECODE, OVERLAP_DECODE})),
     {"u1"}, INFO, {}, ("Failed", "Passed")),
    (dataclasses.replace(HEALTHY_NORMAL, event_loop=OVERLAP_DECODE), {"u1"}, INFO, {}, ("Failed", "Passed")),
    (HEALTHY_NORMAL, {"u1"}, {**INFO, "tp_size": 2}, {}, ("Passed", "Failed")),
    (dataclasses.replace(HEALTHY_NORMAL, event_loop=OVERLAP_DECODE), {"u1"}, {**INFO, "tp_size": 2},
     {"event_loop": False, "server_args": False}, ("Skipped", "Skipped")),
])
def test_gate_states_from_what_the_engines_show(health: GroupHealth | None, facts_pods: set[str],
                                                info: Body | None, policy: Body,
                                                states: tuple[str, str]) -> None:
    pod = _ready_pod("u1")
    facts = EngineFacts(pods=frozenset(facts_pods), server_info={"u1": info} if info else {})
    outcome = _verify(pod, health=health, facts=facts, policy=VerificationSpec(**policy))
    assert outcome.verification is not None
    # (the patches gate's own states: tests/unit/test_patch_set.py)
    assert tuple(str(g.state) for g in outcome.verification.gates if g.name != "patches") == (*states, "Skipped")
    assert outcome.verified == all(s in ("Passed", "Skipped") for s in states)
    assert (outcome.stopped is not None) == ("Failed" in states)


def test_a_failed_gate_says_what_it_expected_and_saw() -> None:
    outcome = _verify(_ready_pod("u1"), health=dataclasses.replace(HEALTHY_NORMAL, event_loop=OVERLAP_DECODE),
                      facts=EngineFacts(pods=frozenset({"u1"}), server_info={"u1": {**INFO, "tp_size": 2}}))
    assert outcome.verification is not None
    messages = {g.name: g.message for g in outcome.verification.gates if g.name not in ("toolCallCanary", "patches")}
    assert messages == {"eventLoop": f"expected {NORMAL_DECODE}, seen {OVERLAP_DECODE}",
                        "serverArgs": "p-u1: tp_size: expected 1, seen 2"}


@pytest.mark.effect("spec.rollout.verification.timeout")
def test_a_gate_still_waiting_after_the_timeout_times_out_counted_from_when_the_pods_were_ready() -> None:
    pod = _ready_pod("u1", since="2026-11-30T12:00:00Z")
    waiting = _verify(pod, health=None, facts=None, now=NOW + datetime.timedelta(minutes=14),
                      policy=VerificationSpec(timeout="15m"))
    assert waiting.deadline == NOW + datetime.timedelta(minutes=15) and waiting.stopped is None
    late = _verify(pod, health=None, facts=None, now=NOW + datetime.timedelta(minutes=15),
                   policy=VerificationSpec(timeout="15m"))
    assert late.stopped is not None and late.stopped.state is GateState.TIMED_OUT
    assert late.stopped.message.startswith("not passed within 15m of the group's pods being Ready")
    sooner = _verify(pod, health=None, facts=None, now=NOW + datetime.timedelta(minutes=2),
                     policy=VerificationSpec(timeout="1m"))
    assert sooner.stopped is not None


# --- the planner: states -> next step -------------------------------------------------------------------------


def test_a_new_pool_is_verified_before_its_current_revision_is_set() -> None:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=1, decode=1), engines=False)
    cluster.converge()
    status = cluster.pool["status"]
    assert status["phase"] == "Ready", "the groups serve meanwhile"
    assert status.get("currentRevision") is None
    assert status["decode"]["updated"] == 0
    verified = condition(cluster, "RolloutVerified")
    assert (verified["status"], verified["reason"]) == ("Unknown", "Verifying")
    assert condition(cluster, "Progressing")["status"] == "True"
    assert gates(cluster, "tiny-decode-0") == {"eventLoop": "Waiting", "patches": "Waiting", "serverArgs": "Waiting",
                                                **CANARY}

    cluster.engines = True  # the agents and /server_info answer
    cluster.converge()
    status = cluster.pool["status"]
    assert status["currentRevision"] == status["updateRevision"]
    assert condition(cluster, "RolloutVerified")["status"] == "True"
    assert condition(cluster, "Progressing")["status"] == "False"
    assert status["decode"]["updated"] == 1
    for name in ("tiny-decode-0", "tiny-prefill-0"):
        assert gates(cluster, name) == {"eventLoop": "Passed", "patches": "Passed", "serverArgs": "Passed", **CANARY}
        assert group(cluster, name)["verifiedRevision"] == group(cluster, name)["revision"]


@pytest.mark.effect("spec.rollout.verification.eventLoop")
def test_switching_overlap_off_rolls_out_verified_on_the_normal_loop() -> None:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=2, decode=2))
    cluster.converge()
    before = cluster.pool["status"]["currentRevision"]
    disable_overlap(cluster)
    plans = cluster.converge(limit=30)
    assert [r for p in plans for r in replaced_roles(p)] == ["decode", "decode", "prefill", "prefill"]
    status = cluster.pool["status"]
    assert status["currentRevision"] == status["updateRevision"] != before
    assert {g["name"]: g["eventLoop"] for g in status["groups"]} == {
        "tiny-decode-0": NORMAL_DECODE, "tiny-decode-1": NORMAL_DECODE,
        "tiny-prefill-0": "event_loop_normal_disagg_prefill", "tiny-prefill-1": "event_loop_normal_disagg_prefill"}
    assert condition(cluster, "RolloutVerified")["status"] == "True"
    # One Event says the rollout is over, once it is verified, not before.
    assert events(plans, "RolloutCompleted") == [
        f"rollout from revision {before} to {status['currentRevision']} completed: all 4 group(s) replaced and "
        "verified"]
    assert events(cluster.converge(limit=3), "RolloutCompleted") == []


def test_a_replaced_group_ready_but_not_verified_holds_the_next_group_and_the_next_role() -> None:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=1, decode=2))
    cluster.converge()
    cluster.engines = False  # the new pods' agents have not answered yet
    disable_overlap(cluster)
    assert replaced_roles(cluster.step()) == ["decode"]
    for _ in range(4):  # recreated, Ready: still not verified, so it still counts against maxUnavailable
        plan = cluster.step()
        assert replaced_roles(plan) == [] and not plan.delete
    assert condition(cluster, "RolloutVerified")["reason"] == "Verifying"
    assert "waiting for tiny-decode-0: eventLoop" in condition(cluster, "RolloutVerified")["message"]
    assert cluster.pool["status"]["decode"]["updated"] == 0
    cluster.engines = True
    assert replaced_roles(cluster.step()) == ["decode"], "verified, so the next group goes in the same step"
    assert cluster.pool["status"]["decode"]["updated"] == 1


@pytest.mark.effect("spec.rollout.verification.eventLoop")
def test_a_group_on_the_wrong_loop_stops_the_rollout_once_and_keeps_serving_until_the_spec_changes() -> None:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=1, decode=2))
    cluster.converge()
    old_revision = cluster.pool["status"]["currentRevision"]
    cluster.loops["tiny-decode-0"] = OVERLAP_DECODE  # its new engines still run the overlap loop
    disable_overlap(cluster)
    plans = cluster.converge(limit=10)
    assert [r for p in plans for r in replaced_roles(p)] == ["decode"], "nothing after the failed group"
    status = cluster.pool["status"]
    assert status["phase"] == "Failed"
    assert status["currentRevision"] == old_revision
    verified = condition(cluster, "RolloutVerified")
    assert (verified["status"], verified["reason"]) == ("False", "GateFailed")
    assert verified["message"] == (f"gate eventLoop failed for decode group tiny-decode-0 at revision "
                                   f"{group(cluster, 'tiny-decode-0')['revision']}: expected {NORMAL_DECODE}, "
                                   f"seen {OVERLAP_DECODE}; holding until the spec changes "
                                   f"(spec.rollout.autoRollback is off)")
    assert condition(cluster, "Progressing")["status"] == "False"
    [warning] = events(plans, "RolloutGateFailed")
    assert warning == f"rollout stopped: {verified['message']}"
    assert [e.type for p in plans for e in p.events if e.reason == "RolloutGateFailed"] == ["Warning"]

    # Level-based: the failure holds from the status alone, even once the engines answer as expected, and the
    # failed group is left serving (not deleted, not restarted).
    cluster.loops.clear()
    for _ in range(3):
        plan = cluster.step()
        assert plan.delete == () and not events([plan], "RolloutGateFailed")
    assert cluster.pool["status"]["phase"] == "Failed"
    assert group(cluster, "tiny-decode-0")["verdict"] == "Healthy"

    # A new revision is a new rollout.
    cluster.pool["spec"]["engine"]["tokenizerBatchDecode"] = "Disabled"
    plans = cluster.converge(limit=30)
    assert condition(cluster, "RolloutVerified")["status"] == "True"
    assert cluster.pool["status"]["phase"] == "Ready"
    assert cluster.pool["status"]["currentRevision"] == cluster.pool["status"]["updateRevision"]


@pytest.mark.effect("spec.rollout.verification.serverArgs")
def test_an_engine_whose_server_info_differs_from_what_was_rendered_fails_the_server_args_gate() -> None:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=1, decode=1))
    cluster.converge()
    cluster.server_args["tiny-decode-0"] = {"disable_overlap_schedule": False}
    disable_overlap(cluster)
    plans = cluster.converge(limit=10)
    assert gates(cluster, "tiny-decode-0") == {"eventLoop": "Passed", "patches": "Passed", "serverArgs": "Failed",
                                                **CANARY}
    verified = condition(cluster, "RolloutVerified")
    assert verified["reason"] == "GateFailed"
    assert "gate serverArgs failed for decode group tiny-decode-0" in verified["message"]
    assert "disable_overlap_schedule: expected True, seen False" in verified["message"]
    assert len(events(plans, "RolloutGateFailed")) == 1
    assert [r for p in plans for r in replaced_roles(p)] == ["decode"]


@pytest.mark.effect("spec.rollout.verification.eventLoop", "spec.rollout.verification.serverArgs")
def test_switched_off_gates_are_skipped_not_passed_and_do_not_hold_the_rollout() -> None:
    cluster = FakeCluster(pool_body(prefill=1, decode=1, rollout__verification={
        "eventLoop": False, "patches": False, "serverArgs": False, "bake": "0s"}), engines=False)
    cluster.converge()
    assert gates(cluster, "tiny-decode-0") == {"eventLoop": "Skipped", "patches": "Skipped", "serverArgs": "Skipped",
                                                **CANARY}
    assert condition(cluster, "RolloutVerified")["status"] == "True"
    disable_overlap(cluster)
    cluster.loops["tiny-decode-0"] = OVERLAP_DECODE
    cluster.converge(limit=20)
    assert cluster.pool["status"]["currentRevision"] == cluster.pool["status"]["updateRevision"]


@pytest.mark.effect("spec.rollout.verification.timeout")
def test_a_group_that_never_answers_times_out_and_stops_the_rollout() -> None:
    cluster = FakeCluster(pool_body(prefill=1, decode=2, rollout__verification={"timeout": "5m"}))
    cluster.converge()
    cluster.engines = False
    disable_overlap(cluster)
    cluster.converge(limit=10)
    plan = cluster.step()
    assert plan.requeue_after == 300.0, "the planner asks to be run again when the wait ends"
    later = cluster.step(now=NOW + datetime.timedelta(minutes=5))
    assert [e.reason for e in later.events if e.type == "Warning"] == ["RolloutGateFailed"]
    verified = condition(cluster, "RolloutVerified")
    assert (verified["status"], verified["reason"]) == ("False", "GateTimedOut")
    assert cluster.pool["status"]["phase"] == "Failed"
    assert replaced_roles(cluster.step(now=NOW + datetime.timedelta(minutes=6))) == []


def test_a_new_kv_layout_still_replaces_everything_at_once_then_verifies_the_new_groups() -> None:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=1, decode=1))
    cluster.converge()
    cluster.engines = False
    cluster.pool["spec"]["engine"]["extraArgs"] = ["--page-size", "64"]
    first = cluster.step()
    assert len({ref.name for ref in first.delete}) == 2
    cluster.converge(limit=10)
    assert condition(cluster, "RolloutVerified")["reason"] == "Verifying"
    cluster.engines = True
    cluster.converge(limit=10)
    assert condition(cluster, "RolloutVerified")["status"] == "True"


def test_verification_survives_a_restarted_operator_with_no_engine_answers_yet() -> None:
    # An operator started afresh has judged nothing yet: what the status says holds.
    cluster = FakeCluster(pool_body(prefill=1, decode=1))
    cluster.converge()
    plan = reconcile.plan(cluster.pool, cluster.observed(), now=NOW)
    assert plan.empty
