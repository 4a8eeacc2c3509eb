"""Acting on a sick group (`planning.health.restarts` through `reconcile.plan`): evidence first, then a restart as a
unit, with backoff, within a budget; past it, the group is left for a person. Pure: no cluster, time passed in."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any

import pytest

from pdfleet.operator.api.status import Verdict
from pdfleet.operator.cache import Observed
from pdfleet.operator.planning import reconcile
from pdfleet.operator.planning.groups import Expectations
from pdfleet.operator.planning.health import restarts
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.plan import Plan, Restart
from tests.support.pools import pool_body
from tests.unit.test_planning import NOW, FakeCluster

Body = dict[str, Any]
GROUP = "tiny-decode-0"
DESYNC = GroupHealth(Verdict.DESYNC, "event_loop_normal_disagg_decode",
                     "ranks diverged for 3.0s: rank 0 in recv_broadcast at collective 11 (iteration 5); "
                     "rank 1 in kv_poll_all_reduce at collective 10 (iteration 5)", 2, True)
HEALTHY = GroupHealth(Verdict.HEALTHY, "event_loop_normal_disagg_decode", "all 2 rank(s) make progress", 2, True)


def at(seconds: float) -> datetime.datetime:
    return NOW + datetime.timedelta(seconds=seconds)


def cluster_with(**health: Any) -> FakeCluster:
    cluster = FakeCluster(pool_body(decode__tp=2, decode__gpusPerNode=2))
    cluster.pool["spec"]["health"] = health
    cluster.converge()
    return cluster


def step(cluster: FakeCluster, verdict: GroupHealth, now: datetime.datetime, *, capture: bool = True,
         expect: Expectations | None = None) -> Plan:
    """One reconcile; evidence requests are fulfilled the way the executor would (a ConfigMap appears)."""
    plan = reconcile.plan(cluster.pool, cluster.observed(), now=now, health={GROUP: verdict}, expect=expect)
    cluster.apply(plan)
    if capture:
        for request in plan.capture:
            cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": copy.deepcopy(request.metadata),
                  "data": {"summary.txt": request.message}}
            cluster.owned[("ConfigMap", request.metadata["name"])] = cm
    return plan


def group(cluster: FakeCluster) -> Body:
    return next(g for g in cluster.pool["status"]["groups"] if g["name"] == GROUP)


def pods_deleted(plan: Plan) -> list[str]:
    return [r.name for r in plan.delete if r.kind == "Pod"]


def evidence(cluster: FakeCluster) -> list[str]:
    return sorted(name for kind, name in cluster.owned if kind == "ConfigMap")


def test_a_sick_group_is_not_restarted_before_its_evidence_is_captured() -> None:
    cluster = cluster_with()

    plan = step(cluster, DESYNC, at(0), capture=False)

    assert pods_deleted(plan) == []
    [request] = plan.capture
    assert (request.group, request.verdict, request.pods) == (GROUP, Verdict.DESYNC, ("tiny-decode-0-0",))
    assert request.metadata["name"] == f"{GROUP}-evidence-1"
    assert request.metadata["ownerReferences"][0]["kind"] == "InferencePool"
    assert request.metadata["labels"]["pdfleet.dev/group"] == GROUP
    assert request.metadata["annotations"][restarts.EVIDENCE_VERDICT] == "Desync"
    # Written but not seen yet: neither captured again nor restarted.
    pending = Expectations(applied={("ConfigMap", f"{GROUP}-evidence-1"): "x"})
    again = step(cluster, DESYNC, at(1), capture=False, expect=pending)
    assert again.capture == () and pods_deleted(again) == []


def test_with_evidence_captured_the_group_is_restarted_as_a_unit_and_says_why() -> None:
    cluster = cluster_with()
    step(cluster, DESYNC, at(0))

    plan = step(cluster, DESYNC, at(1))

    assert pods_deleted(plan) == ["tiny-decode-0-0"]
    # No drain for a sick engine: its in-flight requests never finish, the grace period would only wait.
    assert {ref.grace_period_seconds for ref in plan.delete if ref.kind == "Pod"} == {reconcile.SICK_GRACE_SECONDS}
    assert plan.restarted == (Restart(GROUP, "Desync", (("Pod", "tiny-decode-0-0"),)),)
    [event] = [e for e in plan.events if e.reason == "GroupRestarted"]
    assert event.type == "Warning"
    assert event.message.startswith(f"restarting decode group {GROUP} as a unit: Desync (ranks diverged")
    assert event.message.endswith(f"evidence in ConfigMap {GROUP}-evidence-1; restart 1 of 3 in 1h")
    status = group(cluster)
    assert (status["restarts"], status["lastRestartTime"], status["recentRestarts"], status["restartCause"]) == \
        (1, "2026-11-30T12:00:01Z", ["2026-11-30T12:00:01Z"], "Desync")
    # The evidence is not the pool's garbage: the normal reconcile recreates the pods and keeps the ConfigMap.
    cluster.converge()
    assert evidence(cluster) == [f"{GROUP}-evidence-1"]
    assert "Pod" in {k for k, _ in cluster.owned}


@pytest.mark.effect("spec.health.evidence.keep")
def test_with_evidence_disabled_the_group_is_restarted_at_once() -> None:
    cluster = cluster_with(evidence={"keep": 0})

    plan = step(cluster, DESYNC, at(0))

    assert plan.capture == () and pods_deleted(plan) == ["tiny-decode-0-0"]
    assert "evidence capture disabled" in next(e.message for e in plan.events if e.reason == "GroupRestarted")


def restart_once(cluster: FakeCluster, now: float) -> Plan:
    """Evidence at `now`, then the restart attempt a second later, then the pods come back."""
    step(cluster, DESYNC, at(now))
    plan = step(cluster, DESYNC, at(now + 1))
    cluster.converge()
    return plan


@pytest.mark.parametrize(("restarts_before", "wait_s"), [(1, 10), (2, 20), (3, 40), (4, 60), (5, 60)])
@pytest.mark.effect("spec.health.backoff.initial", "spec.health.backoff.max")
def test_the_backoff_doubles_from_initial_up_to_max(restarts_before: int, wait_s: int) -> None:
    cluster = cluster_with(backoff={"initial": "10s", "max": "1m"}, restartBudget={"count": 10, "window": "1h"})
    t = 0.0
    for _ in range(restarts_before):
        assert pods_deleted(restart_once(cluster, t)), t
        t += 100
    last = t - 100 + 1  # the last restart happened a second after its evidence

    # A new episode: its evidence is captured, but the group waits for the backoff ...
    step(cluster, DESYNC, at(last + 2))
    assert pods_deleted(step(cluster, DESYNC, at(last + wait_s - 1))) == []
    # ... and is restarted once it is over.
    assert pods_deleted(step(cluster, DESYNC, at(last + wait_s))) == ["tiny-decode-0-0"]


@pytest.mark.effect("spec.health.restartBudget.count")
def test_past_the_budget_the_group_is_left_for_a_person_with_one_warning() -> None:
    cluster = cluster_with(backoff={"initial": "1s", "max": "1s"}, restartBudget={"count": 2, "window": "1h"})
    restart_once(cluster, 0)
    restart_once(cluster, 10)

    plans = [step(cluster, DESYNC, at(20 + i)) for i in range(3)]

    assert all(pods_deleted(p) == [] for p in plans)
    assert [len(p.capture) for p in plans] == [1, 0, 0]  # this episode's evidence, for the person
    warnings = [e for p in plans for e in p.events if e.reason == "RestartBudgetExhausted"]
    assert len(warnings) == 1 and warnings[0].type == "Warning"
    status = group(cluster)
    assert status["verdict"] == "Desync" and status["budgetExhausted"] is True
    assert status["message"] == (f"restart budget exhausted: 2 restarts in 1h; left for a person; "
                                 f"evidence in ConfigMap {GROUP}-evidence-3")
    assert warnings[0].message.endswith(status["message"])
    degraded = {c["type"]: c for c in cluster.pool["status"]["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "RestartBudgetExhausted")
    assert plans[-1].empty  # steady: nothing more is written
    assert evidence(cluster) == [f"{GROUP}-evidence-{n}" for n in (1, 2, 3)]


@pytest.mark.effect("spec.health.restartBudget.window")
def test_the_budget_window_slides_and_a_spent_budget_stays_spent_until_a_person_acts() -> None:
    cluster = cluster_with(backoff={"initial": "1s", "max": "1s"}, restartBudget={"count": 1, "window": "1m"})
    restart_once(cluster, 0)
    # Two minutes later the first restart is out of the window: the group may be restarted again.
    assert pods_deleted(restart_once(cluster, 120)) == ["tiny-decode-0-0"]
    step(cluster, DESYNC, at(130))
    assert pods_deleted(step(cluster, DESYNC, at(131))) == []
    assert group(cluster)["budgetExhausted"] is True

    # Spent is spent: an hour later, the window long past, the group is still left for a person ...
    assert pods_deleted(step(cluster, DESYNC, at(3600))) == []
    assert group(cluster)["budgetExhausted"] is True
    # ... who deletes its pod: the group comes back with its budget whole.
    del cluster.owned[("Pod", "tiny-decode-0-0")]
    step(cluster, HEALTHY, at(3700))
    assert (group(cluster)["budgetExhausted"], group(cluster).get("recentRestarts", [])) == (False, [])
    cluster.converge()
    cluster.owned[("Pod", "tiny-decode-0-0")]["metadata"]["creationTimestamp"] = "2026-11-30T13:01:40Z"  # at(3700)
    # A new episode: the evidence of the last one (taken at 130 s, after the last restart) is not this one's.
    first = step(cluster, DESYNC, at(3800))
    assert [r.metadata["name"] for r in first.capture] == [f"{GROUP}-evidence-4"] and pods_deleted(first) == []
    assert pods_deleted(step(cluster, DESYNC, at(3801))) == ["tiny-decode-0-0"]


@pytest.mark.parametrize("verdict", [Verdict.HEALTHY, Verdict.UNKNOWN, Verdict.UNREACHABLE, Verdict.STOPPED])
def test_a_group_that_is_not_desync_hang_or_dead_is_never_restarted(verdict: Verdict) -> None:
    cluster = cluster_with(backoff={"initial": "1s", "max": "1s"})
    health = GroupHealth(verdict, None, "why", 2, True)

    plans = [step(cluster, health, at(i * 100)) for i in range(5)]

    assert all(pods_deleted(p) == [] and p.capture == () and p.restarted == () for p in plans)
    assert group(cluster)["restarts"] == 0


def test_a_stopped_group_is_not_ready_but_not_sick_either() -> None:
    """Its ranks exited cleanly (the engine was shut down on purpose): out of the ready count, since nothing
    serves there, but no Degraded condition, no Warning, no evidence and no restart."""
    cluster = cluster_with()
    step(cluster, HEALTHY, at(0))
    stopped = GroupHealth(Verdict.STOPPED, None, "ranks 0,1: exited cleanly", 0, True)

    plans = [step(cluster, stopped, at(i)) for i in range(1, 4)]

    assert all(p.capture == () and p.restarted == () and pods_deleted(p) == [] for p in plans)
    assert [e for p in plans for e in p.events] == []
    assert (group(cluster)["verdict"], group(cluster)["message"]) == ("Stopped", "ranks 0,1: exited cleanly")
    assert cluster.pool["status"]["decode"]["ready"] == 0
    conditions = {c["type"]: c["status"] for c in cluster.pool["status"]["conditions"]}
    assert (conditions["Degraded"], conditions["Ready"]) == ("False", "False")


@pytest.mark.parametrize("how", ["deletionTimestamp", "operator deleting"])
@pytest.mark.parametrize("verdict", [Verdict.DESYNC, Verdict.HANG, Verdict.DEAD])
def test_a_group_being_drained_or_replaced_is_never_judged_sick_captured_or_restarted(
        how: str, verdict: Verdict) -> None:
    """The monitor may have judged the group from its ranks as they stopped (a poll under way when the pod was
    deleted): a group going away is not judged at all."""
    cluster = cluster_with(backoff={"initial": "1s", "max": "1s"})
    step(cluster, HEALTHY, at(0))
    expect = None
    if how == "deletionTimestamp":
        cluster.owned[("Pod", "tiny-decode-0-0")]["metadata"]["deletionTimestamp"] = "2026-11-30T12:00:00Z"
    else:
        expect = Expectations(deleting=frozenset({("Pod", "tiny-decode-0-0")}))
    sick = GroupHealth(verdict, None, "rank 1: process gone", 1, True)

    plans = [step(cluster, sick, at(i), expect=expect) for i in range(1, 4)]

    assert all(p.capture == () and p.restarted == () and pods_deleted(p) == [] for p in plans)
    assert not [e for p in plans for e in p.events if e.type == "Warning"]
    assert group(cluster)["verdict"] == "Unknown" and group(cluster)["restarts"] == 0
    assert evidence(cluster) == []
    degraded = next(c for c in cluster.pool["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False"


@pytest.mark.parametrize("verdict", [Verdict.HANG, Verdict.DEAD])
def test_hang_and_dead_are_acted_on_like_desync(verdict: Verdict) -> None:
    cluster = cluster_with()
    sick = GroupHealth(verdict, None, "why", 2, True)

    step(cluster, sick, at(0))
    plan = step(cluster, sick, at(1))

    assert pods_deleted(plan) == ["tiny-decode-0-0"] and [r.cause for r in plan.restarted] == [str(verdict)]


@pytest.mark.effect("spec.health.restartBudget.count")
def test_a_budget_of_zero_detects_and_reports_only() -> None:
    cluster = cluster_with(restartBudget={"count": 0})

    plans = [step(cluster, DESYNC, at(i)) for i in range(3)]

    assert all(pods_deleted(p) == [] and p.capture == () for p in plans)
    assert group(cluster)["budgetExhausted"] is False
    degraded = {c["type"]: c for c in cluster.pool["status"]["conditions"]}["Degraded"]
    assert degraded["reason"] == "RankDesync"


@pytest.mark.effect("spec.health.evidence.keep")
def test_only_evidence_keep_bundles_are_kept_per_group_oldest_dropped_first() -> None:
    cluster = cluster_with(evidence={"keep": 2}, backoff={"initial": "1s", "max": "1s"},
                           restartBudget={"count": 10})
    for i in range(3):
        restart_once(cluster, i * 10)

    assert evidence(cluster) == [f"{GROUP}-evidence-2", f"{GROUP}-evidence-3"]


def test_an_evidence_configmap_of_another_pool_or_no_group_is_ignored() -> None:
    stray = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "labels": {}}}
    assert restarts.evidence_of([stray], GROUP) == []
    assert reconcile.plan(pool_body(), Observed(pool=pool_body(), owned={}), now=NOW).capture == ()


def test_evidence_data_stays_under_the_configmap_limit_and_notes_silent_agents() -> None:
    from pdfleet.operator.engines import evidence as evidence_mod

    request = restarts.EvidenceRequest(GROUP, Verdict.DESYNC, "why", ("p0", "p1"), {"name": "x"},
                                       records=True, stacks=True)
    huge = {"ranks": [{"rank": 0, "stacks": "frame\n" * 400_000}]}
    data = evidence_mod.data_of(request, [("p0", {"ranks": []}, huge), ("p1", None, None)])

    assert sum(len(k) + len(v.encode()) for k, v in data.items()) < evidence_mod.MAX_DATA
    assert data["p0.stacks.json"].endswith(evidence_mod.TRUNCATED)
    assert "agents that did not answer: p1" in data["summary.txt"]
    assert data["p1.ranks.json"] == evidence_mod.UNREACHABLE


# An engine that ends at start (a bad image, a patch the launcher refuses): its pod ends, again and again.
CRASH = {"name": "engine", "state": {"terminated": {
    "exitCode": 3, "reason": "Error", "finishedAt": "2026-11-30T12:00:00Z",
    "message": "loading the model\nlauncher: patch kv-poll-lockstep refused: SGLang 0.4.0 is not supported\n"}}}


def end_pod(cluster: FakeCluster, pod: str = "tiny-decode-0-0", *statuses: Body) -> None:
    cluster.owned[("Pod", pod)]["status"] = {"phase": "Failed", "containerStatuses": list(statuses or [CRASH])}


def crash(cluster: FakeCluster, now: float) -> Plan:
    """The group's pod ends; one reconcile at `now` (with whatever restart follows carried out and the pod
    recreated by the next reconciles)."""
    end_pod(cluster)
    plan = step(cluster, HEALTHY, at(now))
    for _ in range(3):
        step(cluster, HEALTHY, at(now))
    return plan


@pytest.mark.effect("spec.health.backoff.initial", "spec.health.backoff.max", "spec.health.restartBudget.count")
def test_a_pod_that_ends_at_start_is_restarted_with_backoff_then_left_for_a_person() -> None:
    cluster = cluster_with(backoff={"initial": "2s", "max": "4s"}, restartBudget={"count": 3, "window": "1h"})

    first = crash(cluster, 0)  # the first restart is not delayed
    assert pods_deleted(first) == ["tiny-decode-0-0"]
    assert first.restarted == (Restart(GROUP, "PodEnded", (("Pod", "tiny-decode-0-0"),)),)
    [event] = [e for e in first.events if e.reason == "GroupRestarted"]
    assert event.type == "Warning" and event.message == (
        f"restarting decode group {GROUP} as a unit: pod tiny-decode-0-0 ended (Error, exit code 3): launcher: "
        "patch kv-poll-lockstep refused: SGLang 0.4.0 is not supported; restart 1 of 3 in 1h")
    status = group(cluster)
    assert (status["restarts"], status["restartCause"]) == (1, "PodEnded")
    assert status["lastExit"] == {"pod": "tiny-decode-0-0", "container": "engine", "reason": "Error", "exitCode": 3,
                                  "message": CRASH["state"]["terminated"]["message"],
                                  "finishedAt": "2026-11-30T12:00:00Z"}
    assert "Pod" in {k for k, _ in cluster.owned}, "recreated"

    # It ends again a second later: the group waits out the backoff (2 s after the last restart) ...
    waiting = crash(cluster, 1)
    assert pods_deleted(waiting) == [] and waiting.requeue_after == 1.0
    status = group(cluster)
    assert (status["nextRestartTime"], status["budgetExhausted"]) == ("2026-11-30T12:00:02Z", False)
    assert status["message"].endswith("restarting the group at 2026-11-30T12:00:02Z (backoff)")
    [backoff] = [e for e in waiting.events if e.reason == "GroupRestartBackOff"]
    assert "backing off until 2026-11-30T12:00:02Z" in backoff.message
    assert not [e for p in (step(cluster, HEALTHY, at(1.5)),) for e in p.events if e.reason == "GroupRestartBackOff"]
    # ... and is restarted when it is over; then the backoff doubles, up to max.
    assert pods_deleted(step(cluster, HEALTHY, at(2))) == ["tiny-decode-0-0"]
    cluster.converge()
    crash(cluster, 3)
    assert group(cluster)["nextRestartTime"] == "2026-11-30T12:00:06Z"  # 2 s doubled
    assert pods_deleted(step(cluster, HEALTHY, at(6))) == ["tiny-decode-0-0"]
    cluster.converge()

    # The budget (3 per hour) is spent: the group is left as it is, with its exit in status, once.
    spent = [crash(cluster, 100 + i) for i in range(3)]
    assert all(pods_deleted(p) == [] and p.restarted == () and p.requeue_after is None for p in spent)
    warnings = [e for p in spent for e in p.events if e.reason == "RestartBudgetExhausted"]
    assert len(warnings) == 1 and warnings[0].type == "Warning"
    status = group(cluster)
    assert (status["budgetExhausted"], status["restartCause"], status["restarts"]) == (True, "PodEnded", 3)
    assert status["message"] == ("restart budget exhausted: 3 restarts in 1h; left for a person; pod tiny-decode-0-0 "
                                 "ended (Error, exit code 3): launcher: patch kv-poll-lockstep refused: SGLang 0.4.0 "
                                 "is not supported")
    assert status["lastExit"]["reason"] == "Error" and warnings[0].message.endswith(status["message"])
    degraded = {c["type"]: c for c in cluster.pool["status"]["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "RestartBudgetExhausted")
    assert f"{GROUP} failed: restart budget exhausted" in degraded["message"]
    # Still so a day later: the window sliding on does not start the crash loop again.
    assert step(cluster, HEALTHY, at(86400)).empty


def test_deleting_the_pods_of_a_group_left_for_a_person_starts_its_budget_afresh() -> None:
    cluster = cluster_with(backoff={"initial": "1s", "max": "1s"}, restartBudget={"count": 1, "window": "1h"})
    crash(cluster, 0)
    crash(cluster, 10)
    assert group(cluster)["budgetExhausted"] is True

    del cluster.owned[("Pod", "tiny-decode-0-0")]  # kubectl delete pod
    step(cluster, HEALTHY, at(20))
    cluster.converge()

    status = group(cluster)
    assert (status["budgetExhausted"], status.get("recentRestarts", [])) == (False, [])
    assert status["lastExit"]["exitCode"] == 3, "the last exit stays for the record"
    assert pods_deleted(crash(cluster, 30)) == ["tiny-decode-0-0"], "restarted again, within its new budget"


def test_a_spec_change_replaces_a_failed_group_at_once_and_starts_its_budget_afresh() -> None:
    cluster = cluster_with(backoff={"initial": "1m", "max": "1m"}, restartBudget={"count": 1, "window": "1h"})
    crash(cluster, 0)
    crash(cluster, 10)
    assert group(cluster)["budgetExhausted"] is True

    cluster.pool["spec"]["engine"]["overlapSchedule"] = "Disabled"  # the fix
    plan = step(cluster, HEALTHY, at(20))

    assert "tiny-decode-0-0" in pods_deleted(plan) and plan.restarted == ()
    [event] = [e for e in plan.events if e.reason == "GroupReplaced" and GROUP in e.message]
    assert "pod tiny-decode-0-0 ended (Error, exit code 3)" in event.message
    assert event.message.endswith("its restart budget starts afresh")
    assert (group(cluster)["budgetExhausted"], group(cluster).get("recentRestarts", [])) == (False, [])


def test_with_a_budget_of_zero_a_failed_group_is_reported_and_left() -> None:
    cluster = cluster_with(restartBudget={"count": 0})

    plans = [crash(cluster, i) for i in range(2)]

    assert all(pods_deleted(p) == [] for p in plans)
    status = group(cluster)
    assert status["budgetExhausted"] is False and status["lastExit"]["exitCode"] == 3
    assert status["message"].endswith("not restarted: restartBudget.count is 0")
    degraded = {c["type"]: c for c in cluster.pool["status"]["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "GroupFailed")


def test_the_exit_is_the_first_failed_container_then_the_last_state_then_the_pod() -> None:
    from pdfleet.operator.planning.groups import MESSAGE_MAX, ended_exit

    def pod(name: str, phase: str, **status: Any) -> Body:
        return {"metadata": {"name": name}, "status": {"phase": phase, **status}}

    ok = {"name": "agent", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    oom = {"name": "engine", "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                                          "message": "x" * 50 + "\n" + "y" * (MESSAGE_MAX + 10)}}}
    running = pod("a-0", "Running", containerStatuses=[CRASH])

    found = ended_exit([running, pod("a-1", "Failed", containerStatuses=[ok, oom])])
    assert (found.pod, found.container, found.reason, found.exit_code) == ("a-1", "engine", "OOMKilled", 137)
    assert found.message is not None and len(found.message) <= MESSAGE_MAX and found.message.startswith("y")
    refused = ended_exit([pod("b-0", "Failed", reason="UnexpectedAdmissionError", message="no GPUs left")])
    assert (refused.container, refused.reason, refused.message) == (None, "UnexpectedAdmissionError", "no GPUs left")
    assert restarts.exit_summary(refused) == "pod b-0 ended (UnexpectedAdmissionError): no GPUs left"
    assert ended_exit([running]) is None


def test_while_a_restarted_group_comes_back_its_status_says_why_it_went() -> None:
    cluster = cluster_with()
    step(cluster, DESYNC, at(0))
    assert pods_deleted(step(cluster, DESYNC, at(1))) == ["tiny-decode-0-0"]

    step(cluster, HEALTHY, at(2))  # the pods are gone; the new ones are created

    status = group(cluster)
    assert status["verdict"] == "Unknown", "its ranks are not judged while it comes back"
    assert status["message"] == "restarting after Desync (restart 1): Missing: 0/1 pod(s) ready"
    cluster.converge()
    assert not group(cluster)["message"].startswith("restarting")


def test_a_verdict_on_pods_the_group_no_longer_has_is_never_acted_on() -> None:
    # The monitor judged the group's previous pods; the planner runs before it has polled the new ones.
    cluster = cluster_with()
    uid = cluster.owned[("Pod", "tiny-decode-0-0")]["metadata"]["uid"]
    stale = dataclasses.replace(DESYNC, pods=frozenset({"uid-of-the-pod-it-had-before"}))

    plan = step(cluster, stale, at(0))

    assert plan.capture == () and pods_deleted(plan) == []
    assert group(cluster)["verdict"] != "Desync"
    assert step(cluster, dataclasses.replace(DESYNC, pods=frozenset({uid})), at(1)).capture, \
        "the same verdict on its current pods is acted on"
