"""Kueue v0.17 admits a pod group whole or not at all on the local cluster: the real Kueue controller manager
(hack/kueue.py), the real apiserver calling its webhooks, the real kube-scheduler binding what Kueue ungates, on
fake GPU nodes of the test's own. Plain pods made here, not yet the operator's: what Kueue itself does with a
group (docs/local-fleet.md, "Gang scheduling with Kueue")."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from tests.support import kueue as kq
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.cluster


def pods(cluster: Cluster, namespace: str, *names: str) -> dict[str, dict[str, Any]]:
    items = cluster.get("pods", "-n", namespace, "-l", "app=kueue-gang-test")["items"]
    return {p["metadata"]["name"]: p for p in items if p["metadata"]["name"] in names}


def create(cluster: Cluster, *objects: dict[str, Any]) -> None:
    cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))


def workload(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", "workloads.kueue.x-k8s.io", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def pending_for_quota(cluster: Cluster, namespace: str, name: str, needed: str) -> str | None:
    """Kueue's verdict on a group's Workload: no quota reserved, for want of `needed` more GPUs."""
    wl = workload(cluster, namespace, name)
    reserved = kq.condition(wl, "QuotaReserved") if wl else None
    if reserved and reserved["status"] == "False" and f"{needed} more needed" in reserved["message"]:
        return reserved["message"]
    return None


def bound_and_running(cluster: Cluster, namespace: str, *names: str) -> dict[str, dict[str, Any]] | None:
    found = pods(cluster, namespace, *names)
    ok = all(p["spec"].get("nodeName") and p["status"].get("phase") == "Running" for p in found.values())
    return found if len(found) == len(names) and ok else None


def reserved_gpus(cluster: Cluster, namespace: str) -> int:
    cq = cluster.get("clusterqueues.kueue.x-k8s.io", namespace)
    return sum(int(r["total"]) for f in cq.get("status", {}).get("flavorsReservation", [])
               for r in f["resources"] if r["name"] == "nvidia.com/gpu")


def test_a_group_that_does_not_fit_holds_nothing_until_it_fits_whole_and_others_pass_it(
    cluster: Cluster, namespace: str, kueue: None
) -> None:
    """Two 8-GPU nodes, a 16-GPU quota. One 8-GPU pod holds a node; a group of two 8-GPU pods then gets no
    quota: both of its pods stay gated and unbound, also once a whole node is free again (kube-scheduler alone
    would bind one pod there and hold its 8 GPUs). A smaller group that fits is admitted past it. When both
    others are gone, the big group's two pods are ungated together and bind on the two nodes."""
    with kq.gpu_nodes(cluster, namespace, 2) as nodes, kq.queues(cluster, namespace, gpus=16):
        retriable_no = {kq.RETRIABLE_ANNOTATION: "false"}  # finished once its pods are gone: its quota is freed
        create(cluster, kq.gpu_pod("holder", namespace, 8))
        wait_for("the holder bound", lambda: bound_and_running(cluster, namespace, "holder"), timeout=120)

        create(cluster, *(kq.gpu_pod(f"big-{i}", namespace, 8, group="big", group_size=2) for i in range(2)))
        message = wait_for("Kueue to refuse the big group quota (8 GPUs short)",
                           lambda: pending_for_quota(cluster, namespace, "big", "8"), timeout=120)
        assert "insufficient unused quota for nvidia.com/gpu" in message, message

        create(cluster, *(kq.gpu_pod(f"small-{i}", namespace, 2, group="small", group_size=2,
                                     annotations=retriable_no) for i in range(2)))
        small = wait_for("the small group admitted past the big one and bound",
                         lambda: bound_and_running(cluster, namespace, "small-0", "small-1"), timeout=120)
        assert {p["spec"]["nodeSelector"][kq.NODES_LABEL] for p in small.values()} == {namespace}, \
            "Kueue admitted it: its flavor's node selector is on the pods"

        cluster.kubectl("delete", "pod", "holder", "-n", namespace, "--wait=true", "--timeout=60s")
        wait_for("the holder's 8 GPUs back in the queue", lambda: reserved_gpus(cluster, namespace) == 4, timeout=60)
        # One node is now free: 8 GPUs, which one pod of the big group would take. Quota 12 of 16 is free.
        wait_for("Kueue to refuse the big group again (4 GPUs short)",
                 lambda: pending_for_quota(cluster, namespace, "big", "4"), timeout=60)
        big = pods(cluster, namespace, "big-0", "big-1")
        for pod in big.values():
            assert kq.gated(pod) and not pod["spec"].get("nodeName"), pod["spec"]

        cluster.kubectl("delete", "pod", "small-0", "small-1", "-n", namespace, "--wait=true", "--timeout=60s")
        placed = wait_for("both pods of the big group bound", lambda: bound_and_running(
            cluster, namespace, "big-0", "big-1"), timeout=120)
        assert {p["spec"]["nodeName"] for p in placed.values()} == set(nodes)
        wl = workload(cluster, namespace, "big")
        assert wl and kq.condition(wl, "Admitted")["status"] == "True", wl


def squat(cluster: Cluster, namespace: str) -> None:
    """A pod outside Kueue (no queue name) that takes one whole test node: Kueue's quota never sees it."""
    pod = kq.gpu_pod("squatter", namespace, 8, queue=None, tolerations=[
        {"key": kq.NODES_LABEL, "operator": "Equal", "value": namespace, "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    pod["spec"]["nodeSelector"] = {kq.NODES_LABEL: namespace}
    create(cluster, pod)
    wait_for("the squatter bound", lambda: bound_and_running(cluster, namespace, "squatter"), timeout=120)


def test_quota_alone_admits_a_group_whose_second_pod_has_no_node(cluster: Cluster, namespace: str,
                                                                 kueue: None) -> None:
    """What Kueue's quota does not know: a pod outside Kueue holds one of the two nodes. The quota (16) admits a
    group of two 8-GPU pods, both are ungated, one binds and holds 8 GPUs, the other cannot be placed. Quota is
    a cluster-level count; node fit needs the topology-aware flavor of the next test."""
    with kq.gpu_nodes(cluster, namespace, 2), kq.queues(cluster, namespace, gpus=16):
        squat(cluster, namespace)
        create(cluster, *(kq.gpu_pod(f"big-{i}", namespace, 8, group="big", group_size=2) for i in range(2)))

        def one_bound_one_stuck() -> dict[str, dict[str, Any]] | None:
            found = pods(cluster, namespace, "big-0", "big-1")
            bound = [p for p in found.values() if p["spec"].get("nodeName")]
            ungated = [p for p in found.values() if not p["spec"].get("schedulingGates")]
            return found if len(found) == 2 and len(bound) == 1 and len(ungated) == 2 else None

        wait_for("the group admitted, one pod bound and one left without a node", one_bound_one_stuck, timeout=120)

        def unschedulable() -> str | None:
            events = cluster.get("events", "-n", namespace, "--field-selector", "reason=FailedScheduling")["items"]
            return next((e["message"] for e in events if e["involvedObject"]["name"].startswith("big-")), None)

        assert "Insufficient nvidia.com/gpu" in wait_for("kube-scheduler to say why", unschedulable, timeout=60)
        wl = workload(cluster, namespace, "big")
        assert wl and kq.condition(wl, "Admitted")["status"] == "True", wl


def test_a_topology_aware_flavor_admits_a_group_only_where_its_pods_fit(cluster: Cluster, namespace: str,
                                                                         kueue: None) -> None:
    """The same two nodes with a topology-aware flavor (a Topology of one level, the node) and quota to spare
    (32): Kueue counts what each node holds, pods outside Kueue included. A pod outside Kueue holds one node, a
    Kueue pod the other, so a group of two 8-GPU pods is refused though its quota is free, and neither pod binds.
    Once both are gone the group is admitted and its pods land one per node.

    The Kueue pod's end is what lets the group in: Kueue v0.17 looks at waiting workloads again on its own
    events (a workload of the queue finishing, a change to a queue, a flavor or a node's labels, taints,
    allocatable or conditions), not when a pod outside Kueue goes away (docs/local-fleet.md)."""
    with kq.gpu_nodes(cluster, namespace, 2) as nodes, \
            kq.queues(cluster, namespace, gpus=32, topology=namespace):
        squat(cluster, namespace)
        unconstrained = {"kueue.x-k8s.io/podset-unconstrained-topology": "true"}
        create(cluster, kq.gpu_pod("holder", namespace, 8, annotations=unconstrained))
        wait_for("the Kueue pod bound", lambda: bound_and_running(cluster, namespace, "holder"), timeout=120)
        create(cluster, *(kq.gpu_pod(f"big-{i}", namespace, 8, group="big", group_size=2,
                                     annotations=unconstrained) for i in range(2)))

        def refused() -> str | None:
            wl = workload(cluster, namespace, "big")
            reserved = kq.condition(wl, "QuotaReserved") if wl else None
            return reserved["message"] if reserved and reserved["status"] == "False" else None

        message = wait_for("Kueue to refuse the group for want of nodes", refused, timeout=120)
        # Both nodes are full for Kueue: one of them by a pod Kueue never admitted.
        assert 'Total nodes: 2; excluded: resource "nvidia.com/gpu": 2' in message, message
        for pod in pods(cluster, namespace, "big-0", "big-1").values():
            assert kq.gated(pod) and not pod["spec"].get("nodeName"), pod["spec"]

        cluster.kubectl("delete", "pod", "squatter", "holder", "-n", namespace, "--wait=true", "--timeout=60s",
                        "--ignore-not-found")
        placed = wait_for("both pods of the group bound", lambda: bound_and_running(
            cluster, namespace, "big-0", "big-1"), timeout=120)
        assert {p["spec"]["nodeName"] for p in placed.values()} == set(nodes)
        assert all(p["spec"]["nodeSelector"].get("kubernetes.io/hostname") for p in placed.values()), \
            "Kueue's topology ungater pins each pod to the node it counted it on"


@pytest.mark.disruptive
def test_with_kueue_down_only_pods_that_ask_for_a_queue_are_refused(cluster: Cluster, namespace: str,
                                                                    kueue: None) -> None:
    """Kueue killed with its webhooks still installed (a crash): a pod without a queue name is created as ever,
    one that asks for a queue is refused rather than started ungated. Kueue is started again afterwards.

    Disruptive: it holds the cluster alone. Kueue's webhooks refuse every gang pod's create and every change to
    one while it is down, and a clean-clone make test once failed test_gang_e2e on that ('failed calling webhook
    vpod.kb.io ... connection refused' while annotating a gang pod in another worker)."""
    if not cluster.is_local:
        pytest.skip("kills the local cluster's Kueue process; an external cluster's Kueue is not this test's")
    pid = int((cluster.kubeconfig.parent / "run" / "kueue.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    try:
        def refused_for_want_of_kueue() -> str | None:
            pod = kq.gpu_pod("asks", namespace, 1)
            proc = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
            return proc.stderr if proc.returncode != 0 and "mpod.kb.io" in proc.stderr else None

        message = wait_for("a pod asking for a queue refused", refused_for_want_of_kueue, timeout=30)
        assert "failed calling webhook" in message, message
        plain = kq.gpu_pod("plain", namespace, 1, queue=None)
        cluster.kubectl("create", "-f", "-", input=json.dumps(plain))
        created = cluster.get("pod", "plain", "-n", namespace)
        assert not created["spec"].get("schedulingGates") and "finalizers" not in created["metadata"]
    finally:
        kq.ensure_running(cluster)
