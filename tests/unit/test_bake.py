"""Rollouts that prove a revision serves: the bake (canary analysis against the old revision's groups), canary first,
the post-rollout watch, and rollback from each. Walked through the real planner step by step, with a clock, and
engines that serve and publish SGLang's counters as a bad revision would make them (`ServingCluster`); plus the
bake's pure judgement as a table.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.rollout import VerificationSpec
from pdfleet.operator.api.status import Bake, GateState, ServingSample, Verdict
from pdfleet.operator.planning import reconcile
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.plan import Plan
from pdfleet.operator.planning.rollout import bake, rollback
from pdfleet.operator.planning.router.router_breakers import RouterView
from pdfleet.operator.render import labels
from tests.support.pools import pool_body
from tests.unit.test_planning import NOW, FakeCluster, replaced_roles

Body = dict[str, Any]
STEP = datetime.timedelta(seconds=30)
PER_STEP = 40  # requests each serving engine finishes per step
TTFT_S, ITL_S, TOKENS = 0.2, 0.02, 10


def env(pod: Body) -> dict[str, str]:
    return {e["name"]: str(e.get("value", "")) for e in pod["spec"]["containers"][0].get("env") or []}


class ServingCluster(FakeCluster):
    """A FakeCluster whose clock moves `STEP` per step and whose Ready groups serve: every leader engine finishes
    `PER_STEP` requests a step and its /metrics counters grow. A pod rendered with `PDFLEET_SIM_FAULT` in its env
    behaves as the simulator's fault says: `failing` (PDFLEET_SIM_FAIL_SHARE of requests aborted),
    `slow-requests` (PDFLEET_SIM_LATENCY_FACTOR times the latencies) from its second step on, `desync` (its ranks
    in Desync) from its fourth: a revision that passes its gates, then breaks once it serves."""

    def __init__(self, pool: Body) -> None:
        super().__init__(pool)
        self.now = NOW
        self.counters: dict[str, ServingSample] = {}
        self.age: dict[str, int] = {}  # steps each leader pod has served
        self.served = True
        self.created = 0

    def apply(self, plan: Plan) -> None:
        super().apply(plan)
        for obj in plan.apply:  # a pod made again is a new pod: a uid of its own, counters from zero
            if obj["kind"] == "Pod":
                self.created += 1
                self.owned[("Pod", obj["metadata"]["name"])]["metadata"]["uid"] = \
                    f"uid-{obj['metadata']['name']}-{self.created}"

    def answers(self) -> tuple[dict[str, Any], dict[str, Any]]:
        health, facts = super().answers()
        for group, found in list(facts.items()):
            leader_uid = next(iter(found.server_info))
            leader = next(o for o in self.owned.values() if o["metadata"].get("uid") == leader_uid)
            fault = env(leader)
            age = self.age.get(leader_uid, 0)
            if fault.get("PDFLEET_SIM_FAULT") == "desync" and age >= 4:
                was = health[group]
                health[group] = GroupHealth(Verdict.DESYNC, was.event_loop, "ranks apart in their collectives",
                                            was.ranks, answered=True)
            sample = self.counters.get(leader_uid, ServingSample(pod=leader_uid))
            facts[group] = dataclasses.replace(found, metrics={leader_uid: sample})
        return health, facts

    def serve(self) -> None:
        for obj in self.owned.values():
            if obj["kind"] != "Pod" or obj["metadata"]["labels"].get(labels.RANK, "0") != "0":
                continue
            uid = obj["metadata"]["uid"]
            fault = env(obj)
            age = self.age[uid] = self.age.get(uid, 0) + 1
            broken = age >= 2
            share = float(fault.get("PDFLEET_SIM_FAIL_SHARE", 0)) if fault.get("PDFLEET_SIM_FAULT") == "failing" \
                and broken else 0.0
            factor = float(fault.get("PDFLEET_SIM_LATENCY_FACTOR", 1)) \
                if fault.get("PDFLEET_SIM_FAULT") == "slow-requests" and broken else 1.0
            was = self.counters.get(uid, ServingSample(pod=uid))
            aborted = round(PER_STEP * share)
            done = PER_STEP - aborted
            self.counters[uid] = was.model_copy(update={
                "requests": was.requests + done, "aborted": was.aborted + aborted,
                "ttft_sum": was.ttft_sum + done * TTFT_S * factor, "ttft_count": was.ttft_count + done,
                "itl_sum": was.itl_sum + done * (TOKENS - 1) * ITL_S * factor,
                "itl_count": was.itl_count + done * (TOKENS - 1)})

    def step(self, now: datetime.datetime = NOW) -> Plan:
        if self.served:
            self.serve()
        plan = super().step(self.now)
        self.now += STEP
        return plan

    def walk(self, steps: int) -> list[Plan]:
        return [self.step() for _ in range(steps)]


def cluster_of(*, prefill: int = 2, decode: int = 2, **rollout: Any) -> ServingCluster:
    cluster = ServingCluster(pool_body(prefill=prefill, decode=decode, rollout__autoRollback=True,
                                       **{f"rollout__{k}": v for k, v in rollout.items()}))
    cluster.walk(6)
    assert cluster.pool["status"]["phase"] == "Ready"
    return cluster


def roll_out(cluster: ServingCluster, fault: dict[str, str] | None = None, **engine: Any) -> str:
    """A person's new revision: `fault` as the simulator's env, or other engine fields. Returns the old
    revision."""
    old = cluster.pool["status"]["currentRevision"]
    if fault is not None:
        engine["env"] = [{"name": k, "value": v} for k, v in fault.items()]
    cluster.pool["spec"]["engine"].update(engine)
    cluster.pool["metadata"]["generation"] += 1
    return old


def reasons(plans: list[Plan]) -> list[str]:
    return [e.reason for p in plans for e in p.events]


def messages(plans: list[Plan], reason: str) -> list[str]:
    return [e.message for p in plans for e in p.events if e.reason == reason]


def group_revisions(cluster: ServingCluster) -> dict[str, str]:
    return {g["name"]: g["revision"] for g in cluster.pool["status"]["groups"]}


def verified_condition(cluster: ServingCluster) -> Body:
    return next(c for c in cluster.pool["status"]["conditions"] if c["type"] == "RolloutVerified")


def record(cluster: ServingCluster) -> str | None:
    raw = (cluster.pool["metadata"].get("annotations") or {}).get(rollback.VERIFIED_SPEC)
    return json.loads(raw)["revision"] if raw else None


def faulty_groups(cluster: ServingCluster) -> set[str]:
    """The groups whose pods run a revision with a simulator fault in its env."""
    return {o["metadata"]["labels"][labels.GROUP] for o in cluster.owned.values()
            if o["kind"] == "Pod" and "PDFLEET_SIM_FAULT" in env(o)}


def walk_watching(cluster: ServingCluster, steps: int) -> tuple[list[Plan], set[str]]:
    """`steps` steps, and every group that ran the faulty revision at any of them (the blast radius)."""
    plans, ran = [], set()
    for _ in range(steps):
        plans.append(cluster.step())
        ran |= faulty_groups(cluster)
    return plans, ran


# --- whole rollouts -------------------------------------------------------------------------------------------


@pytest.mark.effect("spec.rollout.verification.bake", "spec.rollout.postRolloutWatch")
def test_a_good_revision_bakes_each_group_then_is_watched_and_only_then_recorded() -> None:
    cluster = cluster_of(verification={"bake": "2m"}, postRolloutWatch="5m")
    first = cluster.pool["status"]["currentRevision"]
    assert record(cluster) == first, "a pool's first revision is neither baked nor watched"
    roll_out(cluster, overlapSchedule="Disabled")
    plans = cluster.walk(60)
    assert messages(plans, "RolloutCanaryBaking")[0].startswith("canary decode group tiny-decode-")
    assert "compared with 1 group(s) of the old revision" in messages(plans, "RolloutCanaryBaking")[0]
    assert len(messages(plans, "RolloutBakePassed")) == 4, "every group of the new revision baked"
    assert [a.result for p in plans for a in p.analyses] == ["passed"] * 4
    assert all(a.seconds >= 120 for p in plans for a in p.analyses), "each bake lasted its 2m"
    assert reasons(plans).count("RolloutWatching") == 1 and reasons(plans).count("RolloutCompleted") == 1
    assert reasons(plans).index("RolloutWatching") < reasons(plans).index("RolloutCompleted")
    new = cluster.pool["status"]["currentRevision"]
    assert new != first and record(cluster) == new
    assert verified_condition(cluster)["status"] == "True"
    assert verified_condition(cluster)["message"].endswith("and it passed its postRolloutWatch")
    assert sum(len(replaced_roles(p)) for p in plans) == 4, "each group replaced once"
    watch = cluster.pool["status"]["watch"]
    assert watch["revision"] == new and watch.get("failure") is None
    since, until = (datetime.datetime.fromisoformat(watch[k]) for k in ("since", "until"))
    assert until - since == datetime.timedelta(minutes=5)


def test_a_rollout_is_over_only_once_every_router_lists_the_workers_in_rotation() -> None:
    """Every group baked and verified is not enough: a router that does not list a worker the operator holds in
    rotation (the membership read at the last poll) keeps the revision from becoming current, and the status
    says which router. Once it lists them all, the revision is current and its postRolloutWatch begins."""
    cluster = cluster_of(verification={"bake": "1m"})
    first = cluster.pool["status"]["currentRevision"]
    roll_out(cluster, overlapSchedule="Disabled")
    cluster.routers = {"tiny-router-a": RouterView("tiny-router-a", {"prefill": 2, "decode": 1},
                                                   missing=("http://10.0.0.7:30000",))}
    plans = cluster.walk(40)
    status = cluster.pool["status"]
    assert verified_condition(cluster)["status"] == "True", "every group verified"
    assert status["currentRevision"] == first and "RolloutWatching" not in reasons(plans)
    assert status["routers"] == [{"name": "tiny-router-a", "availablePrefill": 2, "availableDecode": 1,
                                  "openCircuits": 0, "missingWorkers": 1}]
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["status"] == "True", progressing
    assert "router tiny-router-a does not list 1 worker(s) in rotation yet" in progressing["message"], progressing
    cluster.routers = {"tiny-router-a": RouterView("tiny-router-a", {"prefill": 2, "decode": 2})}
    plans = cluster.walk(3)
    assert cluster.pool["status"]["currentRevision"] == cluster.pool["status"]["updateRevision"] != first
    assert "RolloutWatching" in reasons(plans), "its postRolloutWatch starts only now"


def test_the_record_does_not_move_while_the_revision_is_watched() -> None:
    cluster = cluster_of(verification={"bake": "1m"}, postRolloutWatch="30m")
    first = record(cluster)
    roll_out(cluster, overlapSchedule="Disabled")
    cluster.walk(40)
    assert cluster.pool["status"]["currentRevision"] != first, "every group runs the new revision verified"
    assert verified_condition(cluster)["reason"] == "Watching" and verified_condition(cluster)["status"] == "Unknown"
    progressing = next(c for c in cluster.pool["status"]["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "Watching")
    assert record(cluster) == first, "rollback and undo still return to the revision before"


@pytest.mark.parametrize(("fault", "why"), [
    ({"PDFLEET_SIM_FAULT": "desync"}, "its ranks are in Desync"),
    ({"PDFLEET_SIM_FAULT": "failing", "PDFLEET_SIM_FAIL_SHARE": "0.25"}, "analysis: error rate 25.0% is above"),
    ({"PDFLEET_SIM_FAULT": "slow-requests", "PDFLEET_SIM_LATENCY_FACTOR": "3"},
     "analysis: mean inter-token latency 60.0 ms is 3.0x the baseline's 20.0 ms"),
], ids=["desync-after-its-gates", "a-quarter-failing", "3x-slower"])
@pytest.mark.effect("spec.rollout.verification.analysis.maxErrorRateIncrease",
                    "spec.rollout.verification.analysis.itlRatio")
def test_a_revision_that_breaks_once_it_serves_is_stopped_at_its_canary_and_rolled_back(
        fault: dict[str, str], why: str) -> None:
    cluster = cluster_of(prefill=2, decode=3, verification={"bake": "3m"})
    good = cluster.pool["status"]["currentRevision"]
    roll_out(cluster, fault)
    plans, ran = walk_watching(cluster, 40)
    assert len(ran) == 1 and next(iter(ran)).startswith("tiny-decode-"), \
        f"one decode group, the canary, ever ran the bad revision: {ran}"
    [failed] = messages(plans, "RolloutAnalysisFailed")
    assert failed.startswith("rollout stopped: gate bake failed for decode group tiny-decode-") and why in failed, \
        failed
    [rolled] = messages(plans, "RolloutRolledBack")
    assert why in rolled
    assert cluster.pool["status"]["currentRevision"] == good and cluster.pool["status"]["phase"] == "Ready"
    assert set(group_revisions(cluster).values()) == {g["revision"] for g in cluster.pool["status"]["groups"]
                                                      if g.get("verifiedRevision") == g["revision"]}
    assert "env" not in cluster.pool["spec"]["engine"]
    assert json.loads(cluster.pool["metadata"]["annotations"][rollback.ROLLED_BACK])["cause"] == "AnalysisFailed"
    assert [a.result for p in plans for a in p.analyses] == ["failed"]
    assert "RolloutCanaryBaking" not in reasons(plans[plans.index(next(p for p in plans if any(
        e.reason == "RolloutRolledBack" for e in p.events))):]), "the return to a verified revision is not baked"


def test_a_revision_that_goes_bad_in_its_watch_is_rolled_back_and_undo_goes_to_the_one_before() -> None:
    cluster = cluster_of(prefill=1, decode=1, verification={"bake": "1m"}, postRolloutWatch="10m")
    good = cluster.pool["status"]["currentRevision"]
    roll_out(cluster, {"PDFLEET_E2E": "1"})
    cluster.walk(20)
    assert verified_condition(cluster)["reason"] == "Watching"
    bad = cluster.pool["status"]["currentRevision"]
    assert bad != good and record(cluster) == good
    # The revision goes bad once it has served a while: its decode group desyncs during the watch.
    decode_leader = next(o for o in cluster.owned.values() if o["kind"] == "Pod" and
                         o["metadata"]["labels"][labels.ROLE] == "decode")
    decode_leader["spec"]["containers"][0].setdefault("env", []).append(
        {"name": "PDFLEET_SIM_FAULT", "value": "desync"})
    plans = cluster.walk(20)
    [failed] = messages(plans, "RolloutRevisionFailed")
    assert f"revision {bad} failed during its postRolloutWatch: decode group tiny-decode-0 turned Desync" in failed
    assert messages(plans, "RolloutRolledBack")
    assert cluster.pool["status"]["currentRevision"] == good and record(cluster) == good
    assert json.loads(cluster.pool["metadata"]["annotations"][rollback.ROLLED_BACK])["cause"] == "RevisionFailed"
    assert [e.revision for e in rollback.history(cluster.pool)] == [good], "the bad one was never recorded"


def test_without_auto_rollback_a_revision_failed_in_its_watch_holds_and_undo_goes_to_the_one_before() -> None:
    cluster = cluster_of(prefill=1, decode=1, verification={"bake": "1m"}, postRolloutWatch="10m")
    cluster.pool["spec"]["rollout"]["autoRollback"] = False
    good = cluster.pool["status"]["currentRevision"]
    roll_out(cluster, {"PDFLEET_E2E": "1"})
    cluster.walk(20)
    for pod in (o for o in cluster.owned.values() if o["kind"] == "Pod"):
        pod["spec"]["containers"][0]["env"].append({"name": "PDFLEET_SIM_FAULT", "value": "desync"})
    plans = cluster.walk(6)
    assert messages(plans, "RolloutRevisionFailed") and not messages(plans, "RolloutRolledBack")
    assert cluster.pool["status"]["phase"] == "Failed" and verified_condition(cluster)["reason"] == "RevisionFailed"
    assert rollback.undo_target(cluster.pool).revision == good


def test_a_group_of_the_new_revision_that_desyncs_after_its_bake_stops_the_rollout() -> None:
    cluster = cluster_of(prefill=1, decode=3, verification={"bake": "1m"})
    good = cluster.pool["status"]["currentRevision"]
    roll_out(cluster, {"PDFLEET_E2E": "1"})
    old_decode = next(g["revision"] for g in cluster.pool["status"]["groups"] if g["role"] == "decode")
    plans = []
    while not (canaries := [g for g in cluster.pool["status"]["groups"] if g["role"] == "decode" and
                            g["revision"] != old_decode and g.get("verifiedRevision") == g["revision"]]):
        plans.append(cluster.step())
        assert len(plans) < 20, "the canary is verified"
    [canary] = canaries
    leader = next(o for o in cluster.owned.values() if o["kind"] == "Pod" and
                  o["metadata"]["labels"][labels.GROUP] == canary["name"])
    leader["spec"]["containers"][0]["env"].append({"name": "PDFLEET_SIM_FAULT", "value": "desync"})
    plans += cluster.walk(30)
    [failed] = messages(plans, "RolloutRevisionFailed")
    assert f"failed during its rollout: decode group {canary['name']} turned Desync" in failed
    assert cluster.pool["status"]["currentRevision"] == good
    assert "prefill" not in {r for p in plans for r in replaced_roles(p)}, "the second role never started"
    assert all("PDFLEET_E2E" not in env(o) for o in cluster.owned.values() if o["kind"] == "Pod"), "all back"


def test_an_operator_restarted_mid_bake_resumes_the_same_bake_and_replaces_no_group_twice() -> None:
    cluster = cluster_of(prefill=1, decode=2, verification={"bake": "3m"})
    roll_out(cluster, overlapSchedule="Disabled")
    cluster.walk(4)
    baking = [g for g in cluster.pool["status"]["groups"] if (g.get("verification") or {}).get("bake")]
    assert len(baking) == 1
    before = baking[0]["verification"]["bake"]
    # A new operator process: nothing in memory, only the cluster (the status holds the bake's start).
    restarted = ServingCluster(json.loads(json.dumps(cluster.pool)))
    restarted.owned, restarted.counters, restarted.age, restarted.now = \
        cluster.owned, cluster.counters, cluster.age, cluster.now
    plans = restarted.walk(40)
    after = next(g for g in restarted.pool["status"]["groups"] if g["name"] == baking[0]["name"])
    assert after["verification"]["bake"]["since"] == before["since"], "the same window"
    assert sum(len(replaced_roles(p)) for p in plans) == 2, "the two groups not yet replaced, once each"


def test_thin_traffic_holds_the_bake_until_min_requests_then_times_out() -> None:
    cluster = cluster_of(prefill=1, decode=1, verification={"bake": "1m", "timeout": "3m",
                                                             "analysis": {"minRequests": 10_000}})
    roll_out(cluster, overlapSchedule="Disabled")
    plans = cluster.walk(8)
    decode = next(g for g in cluster.pool["status"]["groups"] if g["role"] == "decode")
    gate = next(g for g in decode["verification"]["gates"] if g["name"] == "bake")
    assert gate["state"] == "Waiting" and "waiting for traffic to judge" in gate["message"], gate
    plans += cluster.walk(10)
    assert messages(plans, "RolloutGateFailed") and "served only" in messages(plans, "RolloutGateFailed")[0]
    assert [a.result for p in plans for a in p.analyses] == ["timed_out"]


@pytest.mark.effect("spec.rollout.verification.analysis.minRequests")
def test_min_requests_is_what_the_error_rate_waits_for() -> None:
    policy = VerificationSpec.model_validate({"bake": "5m", "analysis": {"minRequests": 100}})
    start = bake.begin(now=NOW, duration=datetime.timedelta(minutes=5), leader=ServingSample(pod="new"),
                       baseline=[ServingSample(pod="old")])
    failing = {"new": ServingSample(pod="new", requests=40, aborted=40), "old": ServingSample(pod="old", requests=200)}
    early = bake.judge(policy, Role.DECODE, start, now=NOW + STEP, leader="new", samples=failing, sick=None)
    assert early.gate.state is GateState.WAITING, "80 requests are fewer than minRequests: not judged yet"
    more = {**failing, "new": ServingSample(pod="new", requests=60, aborted=60)}
    judged = bake.judge(policy, Role.DECODE, start, now=NOW + STEP, leader="new", samples=more, sick=None)
    assert judged.gate.state is GateState.FAILED


# --- the bake's judgement (table) -----------------------------------------------------------------------------


def _bake(**baseline: float) -> Bake:
    return Bake(since=NOW, until=NOW + datetime.timedelta(minutes=5),
                start=(ServingSample(pod="new"), ServingSample(pod="old", **baseline)))


def _served(n: float, *, aborted: float = 0, ttft: float = 0.2, itl: float = 0.02, pod: str = "new",
            routed_failed: float = 0) -> ServingSample:
    return ServingSample(pod=pod, requests=n, aborted=aborted, ttft_sum=n * ttft, ttft_count=n,
                         itl_sum=n * 9 * itl, itl_count=n * 9, routed=n + aborted + routed_failed,
                         routed_failed=routed_failed)


POLICY = VerificationSpec.model_validate({"bake": "5m"})
END = NOW + datetime.timedelta(minutes=5)


@pytest.mark.parametrize(("role", "now", "mine", "base", "sick", "state", "said"), [
    (Role.DECODE, NOW + STEP, _served(100), _served(100, pod="old"), None, GateState.WAITING, "baking until 12:05:00Z"),
    (Role.DECODE, END, _served(100), _served(100, pod="old"), None, GateState.PASSED, "baked 5m: errors 0.0%"),
    (Role.DECODE, NOW + STEP, _served(100), _served(100, pod="old"), "its ranks are in Desync", GateState.FAILED,
     "stopped serving 30s into its 5m bake: its ranks are in Desync"),
    (Role.DECODE, NOW + STEP, _served(90, aborted=10), _served(100, pod="old"), None, GateState.FAILED,
     "error rate 10.0% is above the 2.0% allowed"),
    (Role.DECODE, NOW + STEP, _served(97, aborted=3), _served(97, aborted=3, pod="old"), None, GateState.WAITING,
     "baseline 3.0%"),
    (Role.DECODE, END, _served(100, itl=0.05), _served(100, pod="old"), None, GateState.FAILED,
     "mean inter-token latency 50.0 ms is 2.5x the baseline's 20.0 ms"),
    (Role.DECODE, END, _served(100, itl=0.03), _served(100, pod="old"), None, GateState.PASSED, "baked 5m"),
    (Role.PREFILL, END, _served(100, ttft=0.5), _served(100, pod="old"), None, GateState.FAILED,
     "mean TTFT 500.0 ms is 2.5x the baseline's 200.0 ms"),
    (Role.PREFILL, END, _served(100, itl=0.5), _served(100, pod="old"), None, GateState.PASSED,
     "mean TTFT 200.0 ms"),
    (Role.DECODE, END, _served(100, itl=0.5), None, None, GateState.PASSED, "baseline: none to compare with"),
    (Role.DECODE, END, ServingSample.model_construct(pod="new", requests=-1.0), _served(100, pod="old"), None,
     GateState.FAILED,
     "counters went back"),
    # Failures only the routers saw (refused connections, resets): the engine's own counters look clean.
    (Role.DECODE, NOW + STEP, _served(100, routed_failed=12), _served(100, pod="old"), None, GateState.FAILED,
     "the routers saw 10.7% of the requests they sent it fail, above the 2.0% allowed"),
    (Role.DECODE, NOW + STEP, _served(100, routed_failed=3), _served(100, pod="old", routed_failed=3), None,
     GateState.WAITING, "baseline 0.0% (0 of 100 aborted), routers saw 2.9% fail (3 of 103)"),
], ids=["baking", "passed", "sick", "errors-above-baseline", "errors-as-baseline", "itl-2.5x", "itl-1.5x",
        "ttft-2.5x", "prefill-judged-on-ttft", "no-baseline", "engine-restarted", "routers-saw-failures",
        "routers-saw-as-baseline"])
def test_the_bake_gate(role: Role, now: datetime.datetime, mine: ServingSample, base: ServingSample | None,
                       sick: str | None, state: GateState, said: str) -> None:
    record = _bake() if base is not None else Bake(since=NOW, until=END, start=(ServingSample(pod="new"),))
    samples = {"new": mine, **({"old": base} if base is not None else {})}
    judged = bake.judge(POLICY, role, record, now=now, leader="new", samples=samples, sick=sick)
    assert judged.gate.state is state and said in judged.gate.message, judged.gate.message


@pytest.mark.effect("spec.rollout.verification.analysis.ttftRatio")
def test_the_ttft_ratio_is_what_a_prefill_group_may_be_slower_by() -> None:
    lenient = VerificationSpec.model_validate({"bake": "5m", "analysis": {"ttftRatio": 3}})
    samples = {"new": _served(100, ttft=0.5), "old": _served(100, pod="old")}
    assert bake.judge(lenient, Role.PREFILL, _bake(), now=END, leader="new", samples=samples,
                      sick=None).gate.state is GateState.PASSED
    assert bake.judge(POLICY, Role.PREFILL, _bake(), now=END, leader="new", samples=samples,
                      sick=None).gate.state is GateState.FAILED


def test_metrics_text_is_read_as_sglang_writes_it() -> None:
    text = "\n".join([
        "# TYPE sglang:num_requests_total counter",
        'sglang:num_requests_total{model_name="m",is_streaming="true"} 3.0',
        'sglang:num_requests_total{model_name="m",is_streaming="false"} 4.0',
        "# TYPE sglang:num_aborted_requests_total counter",
        'sglang:num_aborted_requests_total{model_name="m"} 1.0',
        "# TYPE sglang:time_to_first_token_seconds histogram",
        'sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 7.0',
        'sglang:time_to_first_token_seconds_sum{model_name="m"} 1.4',
        'sglang:time_to_first_token_seconds_count{model_name="m"} 7.0',
    ]) + "\n"
    seen = bake.sample("uid-1", text)
    assert seen == ServingSample(pod="uid-1", requests=7, aborted=1, ttft_sum=1.4, ttft_count=7)
    assert bake.sample("uid-1", "not prometheus {") is None
    assert bake.sample("uid-1", "# TYPE other counter\nother_total 1\n") is None


def test_an_engine_that_served_nothing_yet_reads_as_zero_requests_not_as_no_metrics() -> None:
    """SGLang labels num_requests_total by is_streaming: until the first request it declares the counter with no
    sample, and a bake's baseline read then must be 0, not missing."""
    text = "# HELP sglang:num_requests_total Number of requests.\n# TYPE sglang:num_requests_total counter\n"
    assert bake.sample("uid-1", text) == ServingSample(pod="uid-1", requests=0)


# What sglang-router 0.3.2's Prometheus port printed for a PD pair after 10 requests, one of each retried.
ROUTER_METRICS = "\n".join([
    "# TYPE smg_worker_cb_outcomes_total counter",
    'smg_worker_cb_outcomes_total{worker="http://127.0.0.1:43787",outcome="success"} 7',
    'smg_worker_cb_outcomes_total{worker="http://127.0.0.1:50535",outcome="success"} 7',
    'smg_worker_cb_outcomes_total{worker="http://127.0.0.1:43787",outcome="failure"} 1',
    'smg_worker_cb_outcomes_total{worker="http://127.0.0.1:50535",outcome="failure"} 1',
    "# TYPE smg_worker_requests_active gauge",
    'smg_worker_requests_active{worker="http://127.0.0.1:43787"} 0',
    "# TYPE smg_worker_errors_total counter",
    'smg_worker_errors_total{worker_type="decode",connection_mode="http",error_type="backend_error"} 1',
]) + "\n"


def test_router_metrics_are_read_per_worker_and_added_to_the_engines_counters() -> None:
    seen = bake.routed(ROUTER_METRICS)
    assert seen == {"http://127.0.0.1:43787": (8.0, 1.0), "http://127.0.0.1:50535": (8.0, 1.0)}
    assert bake.routed("not prometheus {") is None
    other = {"http://127.0.0.1:43787": (2.0, 2.0)}  # a second router of the pool
    engine = bake.with_routed(_served(5), [seen, other], "http://127.0.0.1:43787")
    assert (engine.routed, engine.routed_failed, engine.requests) == (10.0, 3.0, 5)
    assert bake.with_routed(_served(5), [seen], "http://127.0.0.1:1").routed == 0


def test_a_router_replaced_mid_bake_loses_its_window_and_fails_nothing() -> None:
    start = _served(100, routed_failed=50)  # the routers' counters at the start, one router since replaced
    later = _served(200, routed_failed=1)
    grown = bake.window(start, later)
    assert grown is not None and (grown.routed, grown.routed_failed, grown.requests) == (0.0, 0.0, 100)
    restarted = bake.window(start, _served(50, routed_failed=60))
    assert restarted is None, "an engine counter that went back is still the engine restarting"


def test_probes_are_asked_for_only_past_the_bakes_midpoint_and_only_what_min_requests_lacks() -> None:
    record = _bake()
    quiet = {"new": _served(5), "old": _served(100, pod="old")}
    assert bake.shortfall(POLICY, record, quiet, NOW + datetime.timedelta(minutes=2)) == 0, "traffic may come"
    assert bake.shortfall(POLICY, record, quiet, NOW + datetime.timedelta(minutes=3)) == 15
    busy = {**quiet, "new": _served(50)}
    assert bake.shortfall(POLICY, record, busy, NOW + datetime.timedelta(minutes=3)) == 0


def test_the_canary_of_a_revision_rolled_back_drains_briefly_not_for_the_whole_grace_period() -> None:
    cluster = cluster_of(prefill=1, decode=2, verification={"bake": "3m"})
    roll_out(cluster, {"PDFLEET_SIM_FAULT": "failing", "PDFLEET_SIM_FAIL_SHARE": "0.5"})
    plans = cluster.walk(20)
    back = [ref for p in plans if any(e.reason == "GroupReplaced" for e in p.events) for ref in p.delete
            if ref.kind == "Pod"]
    assert [r.grace_period_seconds for r in back] == [None, reconcile.FAILED_GRACE_SECONDS], \
        "the canary replaced with a drain, then, having failed, replaced back briefly"


def test_the_bake_policy_skips_first_revisions_and_returns_to_verified_ones() -> None:
    assert bake.policy("5m", current_revision=None, update_revision="b", verified_before=[]).skipped
    assert bake.policy("5m", current_revision="a", update_revision="a", verified_before=["a"]).skipped
    assert bake.policy("0s", current_revision="a", update_revision="b", verified_before=["a"]).skipped
    assert bake.policy("5m", current_revision="a", update_revision="b", verified_before=["a"]).skipped is None


