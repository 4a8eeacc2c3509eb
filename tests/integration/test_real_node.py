"""The local cluster's real node (hack/realnode.py): a real kubelet with containerd and runc, whose pods run in
real containers, and whose network reaches nothing outside the machine."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdfleet.operator.cache import Observed
from pdfleet.operator.planning import reconcile
from tests.support.cluster import Cluster, wait_for
from tests.support.pools import pool_body

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))
import realnode  # noqa: E402


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> dict:
    if not cluster.is_local:
        pytest.skip("the real node belongs to the local cluster (PDFLEET_KUBECONFIG names another)")
    found = cluster.kubectl("get", "node", realnode.NODE_NAME, "-o", "json", check=False)
    assert found.returncode == 0, (
        f"node {realnode.NODE_NAME} is missing: the local cluster starts it unless PDFLEET_REAL_NODE=0 "
        f"(hack/realnode.py; `make node-deps` installs its packages). {found.stderr}")
    return json.loads(found.stdout)


def on_real_node(name: str, containers: list[dict], **spec: object) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "nodeSelector": {realnode.LABEL: "true"},
        "tolerations": [{"key": realnode.TAINT["key"], "operator": "Exists"}],
        "containers": containers, **spec}}


def test_the_node_is_a_real_kubelet_on_containerd(node: dict) -> None:
    info = node["status"]["nodeInfo"]
    # The kubelet make binaries built from the pinned Kubernetes module, not one that happened to be on the machine
    assert info["kubeletVersion"] == realnode.lc.pinned("KUBE_VERSION")
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    taints = {t["key"] for t in node["spec"].get("taints", [])}
    assert realnode.TAINT["key"] in taints  # nothing lands here without asking
    assert "node.cloudprovider.kubernetes.io/uninitialized" not in taints
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(realnode.FAKE_GPUS)
    # kwok does not play it: its own annotation is absent, and its heartbeat is the kubelet's
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})


def test_the_node_namespace_has_no_route_out() -> None:
    routes = subprocess.run(["ip", "-n", realnode.NETNS, "-j", "route", "show", "table", "all"], text=True,
                            capture_output=True, check=True).stdout
    destinations = {r.get("dst") for r in json.loads(routes) if r.get("type", "unicast") == "unicast"}
    assert "default" not in destinations
    # Asked of the kernel's routing (nothing is sent): an address outside, one of the documentation ranges
    # (RFC 5737), has no way out of the namespace; the apiserver's Service address is the namespace's own.
    outside = subprocess.run(["ip", "-n", realnode.NETNS, "route", "get", "198.51.100.1"], text=True,
                             capture_output=True)
    assert outside.returncode != 0 and "unreachable" in outside.stderr.lower(), outside.stdout
    vip = subprocess.run(["ip", "-n", realnode.NETNS, "route", "get", realnode.API_VIP], text=True,
                         capture_output=True, check=True).stdout
    assert vip.startswith(f"local {realnode.API_VIP} dev lo")


@pytest.mark.parametrize("address", ["10.244.0.7", "10.0.0.1"])
def test_the_host_cannot_send_to_the_node_s_pod_or_service_addresses(node: dict, address: str) -> None:
    """A host process handed a pod IP of the node or a Service address (an operator run as a local process
    reading an engine's rank health) fails at once instead of sending along the host's default route."""
    route = subprocess.run(["ip", "route", "get", address], text=True, capture_output=True)
    assert route.returncode != 0 and "no route to host" in route.stderr.lower(), route.stdout


def test_a_pod_runs_in_a_real_container_and_is_stopped_with_sigterm(node: dict, cluster: Cluster,
                                                                     namespace: str) -> None:
    """The sandbox image is the node's own pause; the pod's container is the same image run with its entrypoint
    (catatonit, which exits on SIGTERM): Running through a real runc, then gone within its grace period."""
    pod = on_real_node("pause", [{"name": "main", "image": realnode.SANDBOX_IMAGE,
                                  "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False}}],
                       terminationGracePeriodSeconds=30)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    running = wait_for("the pod Running on the real node", lambda: (
        p if (p := cluster.get("pod", "pause", "-n", namespace))["status"].get("phase") == "Running" else None),
        timeout=120)
    assert running["spec"]["nodeName"] == realnode.NODE_NAME
    assert running["status"]["podIP"].startswith(realnode.POD_SUBNET.rsplit(".", 2)[0])
    container_id = running["status"]["containerStatuses"][0]["containerID"]
    assert container_id.startswith("containerd://")
    listed = realnode.crictl("ps", "-q", "--name", "main").stdout.split()
    assert container_id.removeprefix("containerd://") in listed
    cluster.kubectl("delete", "pod", "pause", "-n", namespace, "--wait=true", timeout=60)
    assert container_id.removeprefix("containerd://") not in realnode.crictl("ps", "-a", "-q").stdout.split()


def test_a_tag_pushed_again_is_what_the_next_pod_runs(node: dict, cluster: Cluster, namespace: str) -> None:
    """`make images-push` after a rebuild pushes a new image under the same tag. A pod asking for a tag the node
    already holds is not pulled again (IfNotPresent, the default for a tag), so without the push making the node
    forget its stale copy, every pod would go on running the first build of that name."""
    index_path = realnode.lc.CACHE / "images" / "index.json"
    assert index_path.exists(), f"{index_path} is missing: run `make images` (make test does)"
    images = json.loads(index_path.read_text())["images"]
    ref = f"ghcr.io/pdfleet/retag-check:{namespace}"

    def run(name: str, image: str) -> str:
        """The digest of the image the pod's container ran, as the kubelet reports it."""
        pod = on_real_node(name, [{"name": "main", "image": image, "command": ["true"],
                                   "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False}}],
                           restartPolicy="Never")
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
        ran = wait_for(f"pod {name}'s container started", lambda: next(
            (s["imageID"] for s in cluster.get("pod", name, "-n", namespace)["status"].get("containerStatuses") or []
             if s.get("imageID")), None), timeout=180)
        return str(ran).rsplit("@", 1)[-1]

    first = realnode.push(Path(images["pdfleet-runtime"]["archive"]), ref)
    assert run("first", ref) == first == images["pdfleet-runtime"]["digest"]
    second = realnode.push(Path(images["pdfleet-operator"]["archive"]), ref)
    assert second == images["pdfleet-operator"]["digest"] != first
    assert run("second", ref) == second, "the node ran its stale copy of the tag, not what was pushed"


def test_a_router_pod_with_breakers_runs_its_readiness_sidecar_in_a_real_container(
        node: dict, cluster: Cluster, namespace: str) -> None:
    """The router pod the operator renders for a pool with circuit breakers, as it renders it (the runtime copied in
    by the init container, the sidecar on the router's image, read-only root, non-root, its probe on $(POD_IP)), run
    by the real kubelet: the sidecar answers its probe and, with a router that has no worker, says the pod cannot
    route, in its probe's 503 and its log, having asked the router with the key from the pool's Secret."""
    refs = realnode.push_built(["pdfleet-engine-cpu", "pdfleet-runtime"])
    pool = pool_body(name="rr", namespace=namespace, router__image=refs["pdfleet-engine-cpu"][0],
                     router__circuitBreaker={"enabled": True})
    plan = reconcile.plan(pool, Observed(pool=pool, owned={}), now=datetime.datetime.now(datetime.UTC))
    [deployment] = [o for o in plan.apply if o["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["image"] == refs["pdfleet-runtime"][0]
    # On the real node, beside whatever else runs there: a router pod that asks for no whole core.
    spec |= {"nodeSelector": {realnode.LABEL: "true"}, "affinity": {},
             "tolerations": [{"key": realnode.TAINT["key"], "operator": "Exists"}]}
    for container in spec["containers"]:
        container["resources"]["requests"] = {"cpu": "50m", "memory": "64Mi"}
    cluster.kubectl("create", "serviceaccount", spec["serviceAccountName"], "-n", namespace)
    cluster.kubectl("create", "secret", "generic", "rr-router-key", "-n", namespace, "--from-literal=key-1=k1")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rr-router"}, "spec": spec}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))

    def sidecar() -> dict | None:
        statuses = cluster.get("pod", "rr-router", "-n", namespace)["status"].get("containerStatuses") or []
        return next((s for s in statuses if s["name"] == "ready" and (s.get("state") or {}).get("running")), None)
    running = wait_for("the sidecar running in its container", sidecar, timeout=240)
    assert running["containerID"].startswith("containerd://") and not running["ready"]
    # (Until the router listens, the sidecar says it does not answer.)
    wait_for("the sidecar's verdict in its log: no worker to route to", lambda: (
        "pdfleet-router-ready: not ready: no available prefill or decode worker" in cluster.kubectl(
            "logs", "rr-router", "-c", "ready", "-n", namespace, check=False).stdout), timeout=120)
    probed = wait_for("the kubelet's probe of the sidecar answered 503", lambda: [
        e for e in cluster.get("events", "-n", namespace)["items"]
        if e["involvedObject"].get("fieldPath") == "spec.containers{ready}" and e["reason"] == "Unhealthy"
        and "statuscode: 503" in e["message"]], timeout=60)
    assert probed
    restarts = {s["name"]: s["restartCount"] for s in cluster.get("pod", "rr-router", "-n", namespace)["status"][
        "containerStatuses"]}
    assert restarts["ready"] == 0, restarts
