"""End to end: a desync on one pod of a multi-node engine group is seen on the whole group and the group is restarted
as a unit.

A decode group of `nodesPerGroup: 2` (TP 2, one GPU a pod) is one engine: its collectives span both pods. The
engine simulator's ranks meet across the pods through node rank 0's rendezvous (`--dist-init-addr`), which the
follower finds by the name the operator gives it, through the pod runner's view of cluster DNS
(`<pod dir>/podinfo/hosts`, docs/local-fleet.md). A desync injected on node rank 1's pod alone holds node rank
0's ranks too, the operator judges the group Desync and restarts it, and the new pods serve through the real
router. The shared operator, the pod runner and the real apiserver; no Kueue.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from pdfleet.runtime.simulator import dns
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

POOL = "mn"
DECODE = f"{POOL}-decode-0"
TWO_PODS = {"replicas": 1, "nodesPerGroup": 2, "gpusPerNode": 1, "tp": 2}
DESYNC_AFTER_S = 2.0
HEALTH = {"heartbeatPeriod": "1s", "desyncAfter": "2s", "hangAfter": "4s",
          "restartBudget": {"count": 3, "window": "1h"}, "backoff": {"initial": "5m", "max": "10m"}}


def decode_pods(cluster: Cluster, namespace: str) -> dict[int, dict[str, Any]]:
    """The decode group's live pods by node rank."""
    pods = fleet.engine_pods(cluster, namespace, POOL, group=DECODE)
    return {int(p["metadata"]["labels"]["pdfleet.dev/node-rank"]): p for p in pods
            if not p["metadata"].get("deletionTimestamp")}


def verdict(cluster: Cluster, namespace: str, wanted: str) -> dict[str, Any] | None:
    g = fleet.group_status(cluster, namespace, POOL, DECODE)
    return g if g.get("verdict") == wanted else None


def generate(url: str) -> str | None:
    try:
        r = httpx.post(f"{url}/generate", json={"text": "two pods", "sampling_params": {"max_new_tokens": 4}},
                       timeout=15)
    except httpx.HTTPError:
        return None
    return r.json().get("text") if r.status_code == 200 else None


def test_a_desync_on_node_rank_1_is_judged_on_the_whole_group_which_restarts_and_serves(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode=TWO_PODS, health=HEALTH)
    fleet.wait_ready(cluster, namespace, POOL, timeout=180)
    healthy = wait_for("the two-pod decode group Healthy", lambda: verdict(cluster, namespace, "Healthy"),
                       timeout=60)
    assert healthy["ranks"] == 2, healthy
    before = decode_pods(cluster, namespace)
    assert sorted(before) == [0, 1]
    # The follower's view of cluster DNS names the leader by the host of its --dist-init-addr.
    leader = before[0]
    hosts = cluster.kubeconfig.parent / "pods" / namespace / before[1]["metadata"]["name"] / "podinfo" / "hosts"
    name = f"{leader['spec']['hostname']}.{leader['spec']['subdomain']}.{namespace}.svc"
    args = before[1]["spec"]["containers"][0]["args"]
    assert any(a.removeprefix("--dist-init-addr=").startswith(f"{name}:") for a in args), args
    assert dns.resolve(name, hosts) == dns.Address(leader["status"]["podIP"], leader["metadata"]["uid"])

    diverged_at = time.monotonic()
    fleet.inject(cluster, namespace, before[1]["metadata"]["name"], "desync")
    # The operator restarts a Desync group in the reconcile that judged it, so status may show Desync for less than
    # a read takes (docs/local-fleet.md, benchmarks): the verdict's evidence is read from its Events instead.
    desync = wait_for("a GroupDesync event", lambda: fleet.events(cluster, namespace, POOL, "GroupDesync"),
                      timeout=30, interval=0.1)
    print(f"time to a GroupDesync event of the two-pod group: {time.monotonic() - diverged_at:.2f}s")
    message = desync[0]["message"]
    assert message.startswith(f"decode group {DECODE} is in Desync: ranks diverged for "), message
    # Node rank 0's rank 0 is held in the KV poll by node rank 1's rank 1, which skipped it: without collectives
    # across the pods, rank 0 would have gone on iterating and the group would read Healthy.
    assert "rank 0 in decode_transfer_poll" in message and "rank 1 in recv_broadcast" in message, message
    restarted = wait_for("a GroupRestarted event", lambda: fleet.events(cluster, namespace, POOL, "GroupRestarted"),
                         timeout=60)
    assert restarted[0]["message"].startswith(f"restarting decode group {DECODE} as a unit: Desync (ranks diverged"), \
        restarted[0]["message"]
    [evidence] = cluster.get("configmaps", "-n", namespace, "-l",
                             f"pdfleet.dev/group={DECODE},pdfleet.dev/evidence=true")["items"]
    assert {f"{p['metadata']['name']}.ranks.json" for p in before.values()} <= set(evidence["data"]), \
        sorted(evidence["data"])

    def replaced() -> dict[int, dict[str, Any]] | None:
        now = decode_pods(cluster, namespace)
        fresh = sorted(now) == [0, 1] and all(
            now[r]["metadata"]["uid"] != before[r]["metadata"]["uid"] and fleet.is_ready(now[r]) for r in now)
        return now if fresh else None

    after = wait_for("both pods of the group replaced and Ready", replaced, timeout=120, interval=0.2)
    print(f"time to a replaced, Ready two-pod group: {time.monotonic() - diverged_at:.2f}s")
    wait_for("the new group Healthy", lambda: verdict(cluster, namespace, "Healthy"), timeout=60)
    assert fleet.group_status(cluster, namespace, POOL, DECODE)["restarts"] == 1
    new_leader = after[0]
    new_hosts = cluster.kubeconfig.parent / "pods" / namespace / after[1]["metadata"]["name"] / "podinfo" / "hosts"
    assert dns.resolve(name, new_hosts) == dns.Address(new_leader["status"]["podIP"], new_leader["metadata"]["uid"])

    fleet.wait_ready(cluster, namespace, POOL, timeout=120)
    url = fleet.router_url(cluster, namespace, POOL, workers=2)
    text = wait_for("an answer through the router from the new group", lambda: generate(url), timeout=60,
                    interval=0.5)
    assert text
    assert len(fleet.events(cluster, namespace, POOL, "GroupRestarted")) == 1
