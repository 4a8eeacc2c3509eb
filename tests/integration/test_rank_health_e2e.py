"""End to end: the operator judges rank health through the engines' own agents and tells the truth in status and
events, then acts on a sick group.

Nothing here is started by the test but the operator (run as in `test_operator_e2e.py`): the engine pods are
played by `pdfleet-sim`, each running the launcher with the pod's own arguments, the rank-health agent on the
pod's IP, and the engine simulator's TP ranks writing the real ledger. Faults come from pod annotations.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from pdfleet.runtime.health.agent import DEFAULT_PORT as AGENT_PORT
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

POOL = "tiny"
DECODE = f"{POOL}-decode-0"
HEARTBEAT_S, DESYNC_AFTER_S = 1.0, 2.0
HEALTH = {"heartbeatPeriod": "1s", "desyncAfter": "2s", "hangAfter": "4s"}


def start_pool(cluster: Cluster, namespace: str, health: dict) -> None:
    """One prefill group at TP 1, one decode group at TP 2, no router: the agents are what is under test."""
    fleet.apply_pool(cluster, namespace, POOL, base="minimal",
                     decode={"tp": 2, "gpusPerNode": 2}, health=health, router={"replicas": 0},
                     transfer={"backend": "fake"})
    fleet.wait_ready(cluster, namespace, POOL)


def verdict(cluster: Cluster, namespace: str, group: str, wanted: str) -> dict | None:
    g = fleet.group_status(cluster, namespace, POOL, group)
    return g if g.get("verdict") == wanted else None


def decode_pod(cluster: Cluster, namespace: str) -> dict:
    [pod] = fleet.engine_pods(cluster, namespace, POOL, group=DECODE)
    return pod


@pytest.mark.effect("spec.health.heartbeatPeriod", "spec.health.desyncAfter")
def test_a_desync_is_reported_within_seconds_and_a_straggler_that_catches_up_recovers(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    start_pool(cluster, namespace, {**HEALTH, "restartBudget": {"count": 0}})  # detect and report only
    healthy = wait_for("the decode group Healthy", lambda: verdict(cluster, namespace, DECODE, "Healthy"),
                       timeout=60)
    assert (healthy["eventLoop"], healthy["ranks"]) == ("event_loop_overlap_disagg_decode", 2)
    wait_for("the prefill group Healthy", lambda: verdict(cluster, namespace, f"{POOL}-prefill-0", "Healthy"),
             timeout=30)
    pod = decode_pod(cluster, namespace)

    # Rank 1 stalls in its own code for 6 s while rank 0 waits for it in the next collective: a straggler.
    # Past desyncAfter the positions still differ, so it is reported as Desync; then it catches up.
    diverged_at = time.monotonic()
    fleet.inject(cluster, namespace, pod["metadata"]["name"], "straggle", fault_rank="1", stall_ms="6000")
    desync = wait_for("the decode group in Desync", lambda: verdict(cluster, namespace, DECODE, "Desync"),
                      timeout=30, interval=0.05)
    took = time.monotonic() - diverged_at
    print(f"time to Desync through the operator: {took:.2f}s")
    # desyncAfter + two heartbeats + the runner's annotation delivery and kubectl's reads.
    assert took <= DESYNC_AFTER_S + 2 * HEARTBEAT_S + 1.5, took
    assert "rank 1 in " in desync["message"] and "rank 0 in " in desync["message"]

    degraded = fleet.conditions(cluster, namespace, POOL)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "RankDesync")
    assert DECODE in degraded["message"]
    assert fleet.conditions(cluster, namespace, POOL)["Ready"]["status"] == "False"
    warning = wait_for("a GroupDesync event", lambda: fleet.events(cluster, namespace, POOL, "GroupDesync"),
                       timeout=30)
    assert warning[0]["type"] == "Warning" and DECODE in warning[0]["message"]
    wait_for("the Desync gauge", lambda: operator.metric("pdfleet_engine_groups", role="decode",
                                                         verdict="Desync") >= 1, timeout=30)

    wait_for("the decode group Healthy again", lambda: verdict(cluster, namespace, DECODE, "Healthy"), timeout=30)
    recovered = wait_for("a GroupRecovered event", lambda: fleet.events(cluster, namespace, POOL, "GroupRecovered"),
                         timeout=30)
    assert recovered[0]["type"] == "Normal"
    wait_for("Degraded=False", lambda: fleet.conditions(cluster, namespace, POOL)["Degraded"]["status"] == "False",
             timeout=30)
    assert len(fleet.events(cluster, namespace, POOL, "GroupDesync")) == 1
    # Detect-only: the pod that desynced is the one still running.
    assert decode_pod(cluster, namespace)["metadata"]["uid"] == pod["metadata"]["uid"]


def test_a_desync_is_captured_as_evidence_then_the_group_is_restarted_as_a_unit(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    health = {**HEALTH, "restartBudget": {"count": 3, "window": "1h"}, "backoff": {"initial": "5m", "max": "10m"}}
    start_pool(cluster, namespace, health)
    wait_for("the decode group Healthy", lambda: verdict(cluster, namespace, DECODE, "Healthy"), timeout=60)
    before = decode_pod(cluster, namespace)
    prefill_uid = fleet.engine_pods(cluster, namespace, POOL, role="prefill")[0]["metadata"]["uid"]

    diverged_at = time.monotonic()
    fleet.inject(cluster, namespace, before["metadata"]["name"], "desync")
    name = f"{DECODE}-evidence-1"
    cm = wait_for("the evidence ConfigMap", lambda: next(iter(cluster.get(
        "configmaps", "-n", namespace, "-l", f"pdfleet.dev/group={DECODE},pdfleet.dev/evidence=true")["items"]),
        None), timeout=30, interval=0.2)
    print(f"time to evidence: {time.monotonic() - diverged_at:.2f}s")
    assert cm["metadata"]["name"] == name
    assert cm["metadata"]["ownerReferences"][0]["kind"] == "InferencePool"
    assert cm["metadata"]["annotations"]["pdfleet.dev/evidence-verdict"] == "Desync"
    data = cm["data"]
    assert "verdict: Desync" in data["summary.txt"] and "agents that did not answer: none" in data["summary.txt"]
    [records] = [json.loads(v) for k, v in data.items() if k.endswith(".ranks.json")]
    assert sorted(r["rank"] for r in records["ranks"]) == [0, 1]
    # The desynced rank waits in the next request broadcast; its peer in the decode transfer queue's KV poll.
    assert "recv_broadcast" in json.dumps(records) and "decode_transfer_poll" in json.dumps(records)
    # Real stacks of the simulator's rank processes, captured while they were blocked.
    [stacks] = [json.loads(v) for k, v in data.items() if k.endswith(".stacks.json")]
    assert "Thread" in json.dumps(stacks) or "File" in json.dumps(stacks)
    assert fleet.events(cluster, namespace, POOL, "EvidenceCaptured")[0]["message"].endswith(f"ConfigMap {name}")

    def replaced() -> dict | None:
        pods = fleet.engine_pods(cluster, namespace, POOL, group=DECODE)
        ok = len(pods) == 1 and pods[0]["metadata"]["uid"] != before["metadata"]["uid"] and fleet.is_ready(pods[0])
        return pods[0] if ok else None
    wait_for("the decode group's pod replaced and Ready", replaced, timeout=90, interval=0.2)
    print(f"time to a replaced, Ready group: {time.monotonic() - diverged_at:.2f}s")
    wait_for("the new group Healthy", lambda: verdict(cluster, namespace, DECODE, "Healthy"), timeout=30)
    assert fleet.group_status(cluster, namespace, POOL, DECODE)["restarts"] == 1
    restarted = fleet.events(cluster, namespace, POOL, "GroupRestarted")
    assert len(restarted) == 1 and restarted[0]["type"] == "Warning"
    message = restarted[0]["message"]
    assert message.startswith(f"restarting decode group {DECODE} as a unit: Desync (")
    assert message.endswith(f"evidence in ConfigMap {name}; restart 1 of 3 in 1h")
    wait_for("the restart counter", lambda: operator.metric("pdfleet_group_restarts_total", reason="Desync") >= 1,
             timeout=30)
    # The other group was never touched.
    assert fleet.engine_pods(cluster, namespace, POOL, role="prefill")[0]["metadata"]["uid"] == prefill_uid
    fleet.wait_ready(cluster, namespace, POOL, timeout=60)


def test_an_engine_pod_deleted_in_normal_operation_is_replaced_without_being_judged_sick(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    """Its ranks exit cleanly on the SIGTERM drain and its agent goes with it: none of that is a death, so no
    GroupDead, no evidence and no restart; the normal reconcile recreates the pod."""
    health = {**HEALTH, "restartBudget": {"count": 3, "window": "1h"}, "backoff": {"initial": "1s", "max": "1s"}}
    start_pool(cluster, namespace, health)
    wait_for("the decode group Healthy", lambda: verdict(cluster, namespace, DECODE, "Healthy"), timeout=60)
    before = decode_pod(cluster, namespace)

    cluster.kubectl("delete", "pod", "-n", namespace, before["metadata"]["name"], "--wait=false")

    def replaced() -> dict | None:
        pods = fleet.engine_pods(cluster, namespace, POOL, group=DECODE)
        ok = len(pods) == 1 and pods[0]["metadata"]["uid"] != before["metadata"]["uid"] and fleet.is_ready(pods[0])
        return pods[0] if ok else None
    wait_for("the decode group's pod replaced and Ready", replaced, timeout=90, interval=0.2)
    wait_for("the new group Healthy", lambda: verdict(cluster, namespace, DECODE, "Healthy"), timeout=30)
    fleet.wait_ready(cluster, namespace, POOL, timeout=60)

    for reason in ("GroupDead", "GroupDesync", "GroupHang", "EvidenceCaptured", "GroupRestarted"):
        assert fleet.events(cluster, namespace, POOL, reason) == [], reason
    evidence = cluster.get("configmaps", "-n", namespace, "-l", "pdfleet.dev/evidence=true")["items"]
    assert evidence == []
    assert fleet.group_status(cluster, namespace, POOL, DECODE)["restarts"] == 0


def test_a_rank_that_samples_its_own_token_does_not_desync_a_group_the_operator_renders(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    """A decode rank that samples another token than its peers (`token-divergence`, in every engine's environment)
    desyncs a group whose sampler does not agree its tokens (tests/unit/test_engine_simulator.py). The operator
    sets SYNC_TOKEN_IDS_ACROSS_TP on every group of more than one rank, so under requests through the router the
    group stays Healthy and is never restarted."""
    fleet.apply_pool(cluster, namespace, POOL, base="minimal", decode={"tp": 2, "gpusPerNode": 2}, health=HEALTH,
                     transfer={"backend": "fake"},
                     engine={"env": [{"name": "PDFLEET_SIM_FAULT", "value": "token-divergence"}]})
    fleet.wait_ready(cluster, namespace, POOL)
    (decode,) = fleet.engine_pods(cluster, namespace, POOL, role="decode")
    env = {e["name"]: e.get("value") for e in decode["spec"]["containers"][0].get("env", [])}
    assert env["SYNC_TOKEN_IDS_ACROSS_TP"] == "1"
    url = fleet.router_url(cluster, namespace, POOL, workers=2)
    for n in range(8):
        answer = httpx.post(f"{url}/generate", timeout=30,
                            json={"text": f"request {n}", "sampling_params": {"max_new_tokens": 8}})
        assert answer.status_code == 200, answer.text
    # The ranks go on turning their loop in step after every forward: a desynced group's ranks would sit in
    # different collectives, their iterations frozen.
    agent = f"http://{decode['status']['podIP']}:{AGENT_PORT}/ranks"

    def iterations() -> list[int]:
        return [r["iteration"] for r in httpx.get(agent, timeout=10).json()["ranks"]]
    after = max(iterations())
    wait_for("both decode ranks 50 iterations further", lambda: len(its := iterations()) == 2 and min(its) > after + 50,
             timeout=60, interval=0.5)
    group = fleet.group_status(cluster, namespace, POOL, DECODE)
    assert (group["verdict"], group.get("restarts", 0)) == ("Healthy", 0), group
    assert fleet.events(cluster, namespace, POOL, "GroupRestarted") == []
