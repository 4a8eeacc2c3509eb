"""The local control plane is a real Kubernetes: scheduling, garbage collection, RBAC and tokens all work."""

from __future__ import annotations

import ipaddress
import json
import zlib
from collections.abc import Iterator

import pytest

from hack.localcluster import pinned
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.cluster

def gpu_pod_template(gpus: int) -> dict[str, object]:
    return {
        "metadata": {"labels": {"app": "gpu-burner"}},
        "spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "main", "image": "registry.invalid/gpu-burner:1",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }],
        },
    }


def test_server_reports_the_pinned_kubernetes_version(cluster: Cluster) -> None:
    if not cluster.is_local:
        pytest.skip("an external cluster (PDFLEET_KUBECONFIG) runs whatever version it runs")
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == pinned("KUBE_VERSION")
    assert version["clientVersion"]["gitVersion"] == pinned("KUBE_VERSION")


@pytest.fixture
def own_gpu_nodes(cluster: Cluster, namespace: str) -> Iterator[tuple[str, dict[str, str]]]:
    """Two empty 8-GPU fake nodes that only this test's pods tolerate, and the toleration to land there. The
    cluster's own GPU nodes may be busy with other users' pods (a demo fleet leaves no node with 8 free GPUs),
    and a test must not depend on the cluster being empty."""
    base = cluster.get("nodes", "-l", "pdfleet.dev/local-cluster=true,nvidia.com/gpu.present=true")["items"][0]
    subnet = 2 + zlib.crc32(namespace.encode()) % 120 * 2  # 127.2.N.0/24 and the next: none of the cluster's own
    names = [f"{namespace}-gpu-{i}" for i in range(2)]
    taint = {"key": "pdfleet.dev/test-nodes", "value": namespace, "effect": "NoSchedule"}
    nodes = [{
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": base["metadata"]["labels"] | {"kubernetes.io/hostname": name,
                                                             "pdfleet.dev/test-nodes": namespace}},
        "spec": {"podCIDR": f"127.2.{subnet + i}.0/24", "podCIDRs": [f"127.2.{subnet + i}.0/24"],
                 "taints": [*base["spec"].get("taints", []), taint]},
        "status": {"capacity": base["status"]["capacity"], "allocatable": base["status"]["allocatable"]},
    } for i, name in enumerate(names)]
    cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    try:
        yield namespace, {"key": taint["key"], "operator": "Equal", "value": namespace, "effect": "NoSchedule"}
    finally:
        cluster.kubectl("delete", "node", *names, "--wait=false", "--ignore-not-found", check=False)


def test_gpu_deployment_runs_on_fake_gpu_nodes_with_loopback_pod_ips(
    cluster: Cluster, namespace: str, own_gpu_nodes: tuple[str, dict[str, str]]
) -> None:
    label, toleration = own_gpu_nodes
    template = gpu_pod_template(8)
    template["spec"]["tolerations"].append(toleration)  # type: ignore[index]
    template["spec"]["nodeSelector"] = {"pdfleet.dev/test-nodes": label}  # type: ignore[index]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "gpu-burner", "namespace": namespace},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "gpu-burner"}}, "template": template},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(deployment))

    def running_pods() -> list[dict] | None:
        pods = cluster.get("pods", "-n", namespace, "-l", "app=gpu-burner")["items"]
        ok = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
        return ok if len(ok) == 2 else None

    pods = wait_for("2 GPU pods Running with an IP", running_pods, timeout=90)
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 2, "8 GPUs each: the two pods cannot share an 8-GPU node"
    for node in nodes:
        assert cluster.get("node", node)["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    for pod in pods:
        assert ipaddress.ip_address(pod["status"]["podIP"]).is_loopback, pod["status"]["podIP"]


def test_pod_asking_for_more_gpus_than_any_node_has_stays_pending_with_a_reason(
    cluster: Cluster, namespace: str
) -> None:
    template = gpu_pod_template(9)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "too-big", "namespace": namespace},
           "spec": template["spec"]}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def scheduling_failure() -> str | None:
        events = cluster.get("events", "-n", namespace, "--field-selector",
                             "involvedObject.name=too-big,reason=FailedScheduling")["items"]
        return events[0]["message"] if events else None

    message = wait_for("a FailedScheduling event", scheduling_failure, timeout=60)
    assert "Insufficient nvidia.com/gpu" in message
    assert cluster.get("pod", "too-big", "-n", namespace)["status"]["phase"] == "Pending"


def test_deleting_an_owner_garbage_collects_its_dependents(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    owner_uid = cluster.get("configmap", "owner", "-n", namespace)["metadata"]["uid"]
    dependent = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "dependent", "namespace": namespace, "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}]},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(dependent))
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)

    def dependent_gone() -> bool:
        return cluster.kubectl("get", "configmap", "dependent", "-n", namespace, check=False).returncode != 0

    wait_for("the garbage collector to delete the dependent", dependent_gone, timeout=60)


def test_service_account_without_rbac_is_forbidden_until_a_role_grants_it(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    token = cluster.kubectl("create", "token", "reader", "-n", namespace, "--duration=10m").stdout.strip()
    as_reader = ("--token", token, "--kubeconfig", "/dev/null", "--server", cluster.server,
                 "--certificate-authority", str(cluster.ca_file), "get", "pods", "-n", namespace)

    denied = cluster.kubectl(*as_reader, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()
    assert f"system:serviceaccount:{namespace}:reader" in denied.stderr

    cluster.kubectl("create", "role", "pod-reader", "-n", namespace, "--verb=get,list", "--resource=pods")
    cluster.kubectl("create", "rolebinding", "reader", "-n", namespace, "--role=pod-reader",
                    f"--serviceaccount={namespace}:reader")
    # RBAC changes reach the authorizer through an informer: wait for it instead of guessing how long.
    wait_for("the RoleBinding to take effect", lambda: cluster.kubectl(*as_reader, check=False).returncode == 0,
             timeout=30)
