"""From agents' answers to a group's verdict, and from verdicts to status, conditions and events. Pure."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any

import pytest

from pdfleet.operator.api.health import HealthSpec
from pdfleet.operator.api.status import Verdict
from pdfleet.operator.planning import reconcile
from pdfleet.operator.planning.health.rank_health import GroupHealth, judge_group, own_answers, settled_message
from pdfleet.operator.planning.plan import Plan
from pdfleet.operator.render import labels
from pdfleet.runtime.health import phases, records, report
from tests.support.pools import pool_body
from tests.unit.test_planning import FakeCluster

P = phases.Phase
LOOP = phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE
HEALTH = HealthSpec.model_validate({"heartbeatPeriod": "1s", "desyncAfter": "2s", "hangAfter": "4s"})
NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)
S = 1_000_000_000
Body = dict[str, Any]


def pod(node_rank: int = 0, *, ready: bool = True, deleting: bool = False) -> Body:
    meta: Body = {"name": f"g-{node_rank}", "uid": f"uid-{node_rank}", "labels": {labels.RANK: str(node_rank)}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T12:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running", "podIP": f"127.1.0.{node_rank + 2}",
                                         "conditions": [{"type": "Ready", "status": str(ready)}]}}


def rank(n: int, phase: P = P.FORWARD, *, age_s: float = 0.1, collectives: int = 10, alive: bool = True,
         loop: phases.LoopName = LOOP) -> report.RankEntry:
    record = records.RankRecord(slot=n, rank=n, pid=100 + n, pid_start=1, loop=loop, phase=phase, phase_since_ns=0,
                                iteration=5, collectives=collectives, stack_signal=0, attached_ns=0, consistent=True)
    return report.RankEntry(record=record, alive=alive, phase_age_ns=round(age_s * S))


def answer(*entries: report.RankEntry) -> report.PodReport:
    return report.PodReport(ledger="/dev/shm/pdfleet-ledger", now_ns=1, ranks=entries)


def judge(pods: list[Body], answers: dict[str, report.PodReport | None], *, tp: int = 2, gpus: int = 2,
          before: bool = False) -> GroupHealth:
    return judge_group(HEALTH, tp=tp, gpus_per_node=gpus, nodes=len({p["metadata"]["name"] for p in pods}) or 1,
                       pods=pods, answers=answers, answered_before=before)


DIVERGED = answer(rank(0, P.RECV_BROADCAST, age_s=3, collectives=11), rank(1, P.KV_POLL_ALL_REDUCE, age_s=3))

CASES = [
    # (what, pods, answers, answered_before, verdict, words in the message, ranks reporting)
    ("a pod not Ready yet is starting, never unreachable", [pod(ready=False)], {}, True,
     Verdict.UNKNOWN, "Starting: 0/1 pod(s) ready", 0),
    ("no agent has ever answered: unknown", [pod()], {"g-0": None}, False,
     Verdict.UNKNOWN, "no rank agent has answered yet", 0),
    ("an agent that answered before and is silent now: unreachable", [pod()], {"g-0": None}, True,
     Verdict.UNREACHABLE, "ranks 0,1: agent not answering", 0),
    ("ranks that progress together: healthy", [pod()], {"g-0": answer(rank(0), rank(1))}, False,
     Verdict.HEALTHY, "all 2 rank(s) make progress", 2),
    ("ranks briefly apart between steps: still healthy", [pod()],
     {"g-0": answer(rank(0, P.RECV_BROADCAST, collectives=11), rank(1, P.LOCAL))}, False,
     Verdict.HEALTHY, "all 2 rank(s) make progress", 2),
    ("ranks in different collectives past desyncAfter: desync naming ranks and collectives", [pod()],
     {"g-0": DIVERGED}, False, Verdict.DESYNC,
     "rank 0 in recv_broadcast at collective 11 (iteration 5); rank 1 in kv_poll_all_reduce at collective 10", 2),
    ("ranks in one collective past hangAfter: hang", [pod()],
     {"g-0": answer(rank(0, P.RECV_BROADCAST, age_s=5), rank(1, P.RECV_BROADCAST, age_s=5))}, False,
     Verdict.HANG, "all 2 ranks blocked for 5.0s", 2),
    ("a rank whose process is gone: dead", [pod()], {"g-0": answer(rank(0), rank(1, alive=False))}, False,
     Verdict.DEAD, "rank 1: process gone", 1),
    ("ranks not in their event loop yet: unknown, starting", [pod()],
     {"g-0": answer(rank(0, P.STARTING), rank(1))}, False, Verdict.UNKNOWN, "Starting: rank 0", 2),
    ("one silent pod of a two-node group makes only its ranks unreachable", [pod(0), pod(1)],
     {"g-0": answer(rank(0)), "g-1": None}, False, Verdict.UNREACHABLE, "rank 1: agent not answering", 1),
    ("ranks that exited cleanly, gone or still releasing: stopped, not dead", [pod()],
     {"g-0": answer(rank(0, P.EXITED, alive=False), rank(1, P.EXITED))}, True,
     Verdict.STOPPED, "ranks 0,1: exited cleanly", 0),
    ("a clean exit beside a rank the shutdown killed: stopped, not dead", [pod()],
     {"g-0": answer(rank(0, P.EXITED, alive=False), rank(1, P.KV_POLL_ALL_REDUCE, alive=False))}, True,
     Verdict.STOPPED, "rank 0: exited cleanly; rank 1: process gone", 0),
    ("a pod being deleted is terminating, whatever its ranks show", [pod(deleting=True)],
     {"g-0": answer(rank(0), rank(1, alive=False))}, True, Verdict.UNKNOWN, "Terminating: pod(s) g-0 going", 0),
    ("one pod of a two-node group being deleted: the group is terminating, never unreachable",
     [pod(0), pod(1, deleting=True)], {"g-0": answer(rank(0)), "g-1": None}, True,
     Verdict.UNKNOWN, "Terminating: pod(s) g-1 going", 0),
]


@pytest.mark.parametrize(("pods", "answers", "before", "verdict", "words", "ranks"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_groups_verdict_follows_from_its_pods_and_their_agents_answers(
        pods: list[Body], answers: dict, before: bool, verdict: Verdict, words: str, ranks: int) -> None:
    gpus = 1 if len(pods) == 2 else 2
    judged = judge(pods, answers, gpus=gpus, before=before)

    assert (judged.verdict, judged.ranks) == (verdict, ranks)
    assert words in judged.message


def test_the_event_loop_is_reported_only_when_every_rank_runs_the_same_one() -> None:
    same = judge([pod()], {"g-0": answer(rank(0), rank(1))})
    mixed = judge([pod()], {"g-0": answer(rank(0), rank(1, loop=phases.LoopName.EVENT_LOOP_NORMAL))})

    assert same.event_loop == "event_loop_normal_disagg_decode"
    assert mixed.event_loop is None
    # What each rank runs is kept, so that a half-switched group fails its eventLoop gate instead of waiting.
    assert same.loops == {"event_loop_normal_disagg_decode"}
    assert mixed.loops == {"event_loop_normal_disagg_decode", phases.LoopName.EVENT_LOOP_NORMAL.method}
    assert judge([pod()], {"g-0": answer(rank(0))}).loops == frozenset(), "not every rank reports: nothing said"


def started_pod(seconds_ago: float) -> Body:
    """A Ready pod whose engine container started `seconds_ago` before NOW, as kubelet stamps it (whole seconds)."""
    at = NOW - datetime.timedelta(seconds=seconds_ago)
    body = pod()
    body["status"]["containerStatuses"] = [{"name": "engine", "state": {"running": {
        "startedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ")}}}]
    return body


def aged(entry: report.RankEntry, seconds: float) -> report.RankEntry:
    """`entry` attached `seconds` before the agent answered (its answers say now_ns=100 s)."""
    return dataclasses.replace(entry, record=dataclasses.replace(entry.record, attached_ns=round((100 - seconds) * S)))


def at_100s(*entries: report.RankEntry) -> report.PodReport:
    return report.PodReport(ledger="/dev/shm/pdfleet-ledger", now_ns=100 * S, ranks=entries)


def test_ranks_older_than_their_pod_are_another_pods_and_never_judge_it() -> None:
    # A predecessor still holding the pod's IP answers for it: ranks attached 25 s ago, the pod started 1 s ago.
    # Its loop is not the pod's, so nothing of it may reach the verdict or the eventLoop gate.
    old = phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE
    stale = at_100s(aged(rank(0, loop=old), 25), aged(rank(1, loop=old), 25))
    pods = [started_pod(1)]

    own = own_answers(pods, {"g-0": stale}, now=NOW)

    assert own == {"g-0": None}, "no rank left: no answer from the pod at all"
    judged = judge(pods, own)
    assert (judged.verdict, judged.event_loop, judged.answered) == (Verdict.UNKNOWN, None, False)


def test_a_pods_own_ranks_are_kept_and_only_older_records_beside_them_dropped() -> None:
    mine = at_100s(aged(rank(0), 0.5), aged(rank(1), 0.5))
    beside = at_100s(aged(rank(0), 0.5), aged(rank(1), 0.5), dataclasses.replace(aged(rank(1), 30), alive=False))

    assert own_answers([started_pod(1)], {"g-0": mine}, now=NOW) == {"g-0": mine}
    assert own_answers([started_pod(1)], {"g-0": beside}, now=NOW) == {"g-0": mine}
    # Within the clock-skew slack a rank may look a little older than its pod.
    assert own_answers([started_pod(1)], {"g-0": at_100s(aged(rank(0), 4))}, now=NOW)["g-0"] is not None


def test_an_answer_that_names_its_pod_is_the_pods_exactly_when_the_uid_is() -> None:
    # A predecessor's agent at the pod's address names the predecessor: never the pod's, however fresh its
    # ranks look (no clock is read, so no skew between operator and node can mislead it).
    pods = [started_pod(1)]
    uid = pods[0]["metadata"]["uid"]
    fresh = at_100s(aged(rank(0), 0.5), aged(rank(1), 0.5))
    predecessor = dataclasses.replace(fresh, pod_uid="uid-of-the-predecessor")
    own = dataclasses.replace(fresh, pod_uid=uid)

    assert own_answers(pods, {"g-0": predecessor}, now=NOW) == {"g-0": None}
    assert own_answers(pods, {"g-0": own}, now=NOW) == {"g-0": own}
    # Its own ranks are kept even when the node's clock runs far ahead of the operator's (startedAt "later").
    skewed = own_answers(pods, {"g-0": dataclasses.replace(at_100s(aged(rank(0), 60)), pod_uid=uid)}, now=NOW)
    assert skewed["g-0"] is not None and len(skewed["g-0"].ranks) == 1


def test_the_pod_uid_survives_the_json_contract_and_older_answers_lack_it() -> None:
    named = dataclasses.replace(at_100s(aged(rank(0), 1)), pod_uid="u-1")
    assert report.from_json(report.to_json(named)).pod_uid == "u-1"
    assert "pod_uid" not in report.to_json(at_100s(aged(rank(0), 1)))
    assert report.from_json(report.to_json(at_100s(aged(rank(0), 1)))).pod_uid is None


@pytest.mark.parametrize("why", ["no startedAt", "no attach time", "no answer"])
def test_answers_that_cannot_be_dated_are_taken_as_they_are(why: str) -> None:
    stale = at_100s(aged(rank(0), 25), aged(rank(1), 25))
    pods, answer_ = [started_pod(1)], stale
    if why == "no startedAt":
        pods = [pod()]
    elif why == "no attach time":  # an agent older than the attach stamp reports 0
        answer_ = at_100s(rank(0), rank(1))
    answers = {"g-0": None if why == "no answer" else answer_}

    assert own_answers(pods, answers, now=NOW) == answers


def test_a_held_desync_keeps_its_first_evidence_so_status_is_not_rewritten_every_poll() -> None:
    first = judge([pod()], {"g-0": DIVERGED})
    later = judge([pod()], {"g-0": answer(rank(0, P.RECV_BROADCAST, age_s=9, collectives=11),
                                          rank(1, P.KV_POLL_ALL_REDUCE, age_s=9))})

    assert first.message != later.message
    assert settled_message(first, later) == first.message
    assert settled_message(first, judge([pod()], {"g-0": answer(rank(0), rank(1))})) == "all 2 rank(s) make progress"


# The planner with verdicts as input: the minimal pool, decode at tp 2.

def converged() -> FakeCluster:
    """A converged pool that detects and reports only (restartBudget.count 0): acting on a sick group, evidence
    and restarts, is `test_restarts.py`'s subject."""
    cluster = FakeCluster(pool_body(decode__tp=2, decode__gpusPerNode=2))
    cluster.pool["spec"]["health"] = {"restartBudget": {"count": 0}}
    cluster.converge()
    return cluster


def step(cluster: FakeCluster, health: dict[str, GroupHealth]) -> Plan:
    plan = reconcile.plan(cluster.pool, cluster.observed(), now=NOW, health=health)
    cluster.apply(plan)
    return plan


def conditions(cluster: FakeCluster) -> dict[str, dict]:
    return {c["type"]: c for c in cluster.pool["status"]["conditions"]}


HEALTHY = GroupHealth(Verdict.HEALTHY, "event_loop_normal_disagg_decode", "all 2 rank(s) make progress", 2, True)
DESYNC = GroupHealth(Verdict.DESYNC, "event_loop_normal_disagg_decode",
                     "ranks diverged for 3.0s: rank 0 in recv_broadcast at collective 11 (iteration 5); "
                     "rank 1 in kv_poll_all_reduce at collective 10 (iteration 5)", 2, True)


def test_a_desync_makes_the_pool_degraded_with_a_warning_and_recovery_is_announced() -> None:
    cluster = converged()
    prefill = GroupHealth(Verdict.HEALTHY, None, "all 1 rank(s) make progress", 1, True)
    step(cluster, {"tiny-prefill-0": prefill, "tiny-decode-0": HEALTHY})
    assert conditions(cluster)["Ready"]["status"] == "True"

    plan = step(cluster, {"tiny-prefill-0": prefill, "tiny-decode-0": DESYNC})

    group = next(g for g in cluster.pool["status"]["groups"] if g["name"] == "tiny-decode-0")
    assert (group["verdict"], group["eventLoop"], group["ranks"]) == ("Desync", "event_loop_normal_disagg_decode", 2)
    degraded = conditions(cluster)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "RankDesync")
    assert "tiny-decode-0 Desync" in degraded["message"]
    assert conditions(cluster)["Ready"]["status"] == "False"
    assert cluster.pool["status"]["decode"]["ready"] == 0
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "GroupDesync")]
    assert "rank 1 in kv_poll_all_reduce at collective 10" in plan.events[0].message

    held = dataclasses.replace(DESYNC, message=DESYNC.message.replace("3.0s", "7.0s"))
    assert step(cluster, {"tiny-prefill-0": prefill, "tiny-decode-0": held}).empty

    plan = step(cluster, {"tiny-prefill-0": prefill, "tiny-decode-0": HEALTHY})
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "GroupRecovered"), ("Normal", "PoolReady")]
    assert conditions(cluster)["Degraded"]["status"] == "False"


@pytest.mark.parametrize(("verdict", "reason"), [(Verdict.HANG, "RankHang"), (Verdict.DEAD, "RankDead"),
                                                 (Verdict.UNREACHABLE, "AgentUnreachable")])
def test_every_sick_verdict_names_its_own_degraded_reason(verdict: Verdict, reason: str) -> None:
    cluster = converged()

    step(cluster, {"tiny-decode-0": GroupHealth(verdict, None, "why", 0, True)})

    degraded = conditions(cluster)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", reason)
    assert cluster.pool["status"]["phase"] == "Degraded"


def test_a_group_no_agent_answered_yet_still_counts_as_ready_and_is_written_once() -> None:
    cluster = converged()
    unknown = GroupHealth(Verdict.UNKNOWN, None, "no rank agent has answered yet (1 pod(s) asked)", 0)

    first = step(cluster, {"tiny-decode-0": unknown})
    again = step(cluster, {"tiny-decode-0": unknown})

    assert first.status is not None and again.empty
    assert conditions(cluster)["Ready"]["status"] == "True"


def test_before_the_first_poll_the_last_status_verdict_stands() -> None:
    cluster = converged()
    step(cluster, {"tiny-decode-0": DESYNC})
    before = copy.deepcopy(cluster.pool["status"])

    assert step(cluster, {}).empty
    assert cluster.pool["status"] == before


def test_a_group_whose_pods_are_starting_is_unknown_whatever_was_polled() -> None:
    cluster = converged()
    for (kind, _), obj in cluster.owned.items():
        if kind == "Pod" and obj["metadata"]["labels"][labels.GROUP] == "tiny-decode-0":
            obj["status"]["conditions"] = [{"type": "Ready", "status": "False"}]

    step(cluster, {"tiny-decode-0": DESYNC})

    group = next(g for g in cluster.pool["status"]["groups"] if g["name"] == "tiny-decode-0")
    assert (group["verdict"], group["message"]) == ("Unknown", "Starting: 0/1 pod(s) ready")
