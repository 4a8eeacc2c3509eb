"""End to end on the local cluster: the overlap-desync playbook. The operator runs as in `test_operator_e2e.py`,
`pdfleet-sim` plays every pod, and the engine simulator's ranks report their event loop and their collectives
through the real rank agents: the Desync is judged from what a real engine would show.

A desync is injected as in `test_serving_e2e.py` (the pod annotation `sim.pdfleet.dev/fault=desync`). The pool's
manifest sets `overlapSchedule: Enabled` explicitly, as a git repository would hold it, so that `kubectl apply`
of the same manifest afterwards reverts the operator's change: a GitOps tool's re-sync.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

POOL = "playbook"
ANNOTATION = "pdfleet.dev/playbook-overlap-desync"
DECODE = f"{POOL}-decode-0"
# The manifest in git: 1 prefill + 1 decode group, the playbook on, overlap on (spelled out).
MANIFEST: dict[str, Any] = {
    "prefill": {"replicas": 1}, "decode": {"replicas": 1}, "engine": {"overlapSchedule": "Enabled"},
    "rollout": {"playbooks": {"overlapDesync": {"action": "DisableOverlapSchedule"}}},
}
OVERLAP = {"prefill": "event_loop_overlap_disagg_prefill", "decode": "event_loop_overlap_disagg_decode"}
NORMAL = {"prefill": "event_loop_normal_disagg_prefill", "decode": "event_loop_normal_disagg_decode"}


def settled(cluster: Cluster, namespace: str, *, generation: int) -> dict[str, Any]:
    """The pool once the spec at `generation` rolled out verified: every group on the loop it implies."""
    def done() -> dict[str, Any] | None:
        body = fleet.pool(cluster, namespace, POOL)
        now = body.get("status") or {}
        verified = fleet.conditions_of(now).get("RolloutVerified") or {}
        ok = body["metadata"]["generation"] == generation == now.get("observedGeneration") and \
            verified.get("status") == "True" and now.get("currentRevision") == now.get("updateRevision") and \
            now.get("phase") == "Ready"
        return body if ok else None
    return wait_for(f"the pool verified at generation {generation}", done, timeout=240, interval=0.5)


def loops(body: dict[str, Any]) -> dict[str, str | None]:
    return {g["role"]: g.get("eventLoop") for g in body["status"]["groups"]}


def record(body: dict[str, Any]) -> dict[str, Any] | None:
    raw = (body["metadata"].get("annotations") or {}).get(ANNOTATION)
    return json.loads(raw) if raw else None


def event_count(cluster: Cluster, namespace: str, reason: str) -> int:
    return sum(e.get("count", 1) for e in fleet.events(cluster, namespace, POOL, reason))


def desync(cluster: Cluster, namespace: str) -> None:
    [victim] = fleet.engine_pods(cluster, namespace, POOL, group=DECODE)
    fleet.inject(cluster, namespace, victim["metadata"]["name"], "desync")


def test_an_overlap_desync_rolls_out_the_normal_loop_verified_once_and_a_gitops_revert_is_not_fought(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL, **MANIFEST)
    first = settled(cluster, namespace, generation=1)
    assert loops(first) == OVERLAP and record(first) is None

    desync(cluster, namespace)
    fired = wait_for("the PlaybookOverlapDesync Event",
                     lambda: fleet.events(cluster, namespace, POOL, "PlaybookOverlapDesync"), timeout=90)
    second = settled(cluster, namespace, generation=2)

    # The operator changed only overlapSchedule, and said why on the pool.
    assert second["spec"]["engine"]["overlapSchedule"] == "Disabled"
    assert {**second["spec"]["engine"], "overlapSchedule": "Enabled"} == first["spec"]["engine"]
    assert {k: v for k, v in second["spec"].items() if k != "engine"} == \
        {k: v for k, v in first["spec"].items() if k != "engine"}
    why = record(second)
    assert why is not None and (why["group"], why["event_loop"], why["generation"]) == \
        (DECODE, OVERLAP["decode"], 2)
    evidence = cluster.get("configmap", why["evidence"], "-n", namespace)
    assert evidence["metadata"]["annotations"]["pdfleet.dev/evidence-verdict"] == "Desync"
    [event] = fired
    assert (event["type"], event.get("count", 1)) == ("Warning", 1)
    assert DECODE in event["message"] and f"evidence in ConfigMap {why['evidence']}" in event["message"]

    # Restarted once for the Desync, and the rollout ended verified with every rank on the normal loop.
    assert loops(second) == NORMAL
    assert all(g["verifiedRevision"] == g["revision"] for g in second["status"]["groups"])
    assert second["status"]["currentRevision"] != first["status"]["currentRevision"]
    decode = fleet.group_status(cluster, namespace, POOL, DECODE)
    assert (decode["restarts"], decode["restartCause"]) == (1, "Desync")
    assert event_count(cluster, namespace, "GroupRestarted") == 1

    # A GitOps tool re-applies the manifest in git (overlapSchedule: Enabled): the operator leaves it, says so
    # once, and the old revision rolls out verified on the overlap loop.
    fleet.apply_pool(cluster, namespace, POOL, **MANIFEST)
    [reverted] = wait_for("the PlaybookOverlapDesyncReverted Event", lambda: fleet.events(
        cluster, namespace, POOL, "PlaybookOverlapDesyncReverted"), timeout=60)
    assert reverted["type"] == "Warning" and "reverted by someone" in reverted["message"]
    assert f"until the annotation {ANNOTATION} is removed" in reverted["message"]
    third = settled(cluster, namespace, generation=3)
    assert third["spec"]["engine"]["overlapSchedule"] == "Enabled" and loops(third) == OVERLAP
    assert record(third) == {**why, "reverted": 3}

    # Another overlap desync: restarted as any Desync, the spec left as git says, nothing said again.
    desync(cluster, namespace)
    wait_for("the second restart", lambda: event_count(cluster, namespace, "GroupRestarted") == 2, timeout=90)
    fourth = settled(cluster, namespace, generation=3)
    assert fourth["spec"]["engine"]["overlapSchedule"] == "Enabled" and record(fourth) == record(third)
    assert event_count(cluster, namespace, "PlaybookOverlapDesync") == 1
    assert event_count(cluster, namespace, "PlaybookOverlapDesyncReverted") == 1
