"""The chart, installed by real helm with the images `make images` built, runs the operator in real containers on
the local cluster's real node: pulled by digest, admitted under Pod Security `restricted`, Ready through its real
probes, one of two replicas leading, and the Lease handed over when the leader's pod is deleted."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import real_node
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "pdfleet-real"


def pods(cluster: Cluster, namespace: str) -> list[dict]:
    return cluster.get("pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]


def ready(pod: dict) -> bool:
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")


def holder(cluster: Cluster, namespace: str) -> str:
    lease = cluster.kubectl("get", "lease", RELEASE, "-n", namespace, "-o", "json", check=False)
    return json.loads(lease.stdout)["spec"].get("holderIdentity") or "" if lease.returncode == 0 else ""


@pytest.fixture(scope="module")
def release(cluster: Cluster) -> Iterator[tuple[str, str, dict[str, real_node.Pushed]]]:
    """The chart in a namespace that enforces `restricted`, watching one pool namespace of its own (the suite's
    other operators own the rest)."""
    if not cluster.is_local:
        pytest.skip("the real node belongs to the local cluster (PDFLEET_KUBECONFIG names another)")
    images = real_node.push_images("pdfleet-operator", "pdfleet-runtime")
    suffix = uuid.uuid4().hex[:8]
    system, pools = f"real-system-{suffix}", f"real-pools-{suffix}"
    for ns, level in ((system, "restricted"), (pools, "baseline")):
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("label", "namespace", ns, f"pod-security.kubernetes.io/enforce={level}",
                        f"pod-security.kubernetes.io/warn={level}")
    values = {
        "image": {"digest": images["pdfleet-operator"].digest},
        "runtime": {"image": {"digest": images["pdfleet-runtime"].digest}},
        "watchNamespaces": [pools],
        "nodeSelector": real_node.NODE_SELECTOR, "tolerations": real_node.TOLERATIONS,
    }
    try:
        cluster.run("helm", "install", RELEASE, str(ROOT / "charts" / "pdfleet"), "--namespace", system,
                    "--values", "-", "--wait", "--timeout", "180s", input=json.dumps(values), timeout=240)
        yield system, pools, images
    finally:
        cluster.helm("uninstall", RELEASE, "--namespace", system, "--wait", check=False)
        cluster.kubectl("delete", "namespace", system, pools, "--wait=false", check=False)


def test_the_operator_runs_in_real_containers_pulled_by_digest_under_restricted(
        cluster: Cluster, release: tuple[str, str, dict[str, real_node.Pushed]]) -> None:
    system, _, images = release
    running = wait_for("two operator pods Ready", lambda: (
        p if len(p := [x for x in pods(cluster, system) if ready(x)]) == 2 else None), timeout=120)
    for pod in running:
        assert pod["spec"]["nodeName"] == real_node.NODE
        status = pod["status"]["containerStatuses"][0]
        assert status["containerID"].startswith("containerd://")
        # The image the kubelet pulled is the one `make images` built, by digest
        assert pod["spec"]["containers"][0]["image"] == images["pdfleet-operator"].pinned
        assert status["imageID"].endswith(images["pdfleet-operator"].digest)
        assert f"--runtime-image={images['pdfleet-runtime'].pinned}" in pod["spec"]["containers"][0]["args"]
    namespace = cluster.get("namespace", system)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    leader = wait_for("a leader", lambda: holder(cluster, system) or None, timeout=60)
    assert leader.split("_")[0] in {p["metadata"]["name"] for p in running}


def test_deleting_the_leader_s_pod_hands_the_lease_over(
        cluster: Cluster, release: tuple[str, str, dict[str, real_node.Pushed]]) -> None:
    system, _, _ = release
    wait_for("two operator pods Ready", lambda: len([p for p in pods(cluster, system) if ready(p)]) == 2 or None,
             timeout=120)
    leader = wait_for("a leader", lambda: holder(cluster, system) or None, timeout=60)
    leader_pod = next(p["metadata"]["name"] for p in pods(cluster, system) if leader.startswith(p["metadata"]["name"]))
    standby = next(p["metadata"]["name"] for p in pods(cluster, system) if p["metadata"]["name"] != leader_pod)
    # A real SIGTERM from the kubelet: the leader releases the Lease as it stops, the standby takes it.
    cluster.kubectl("delete", "pod", leader_pod, "-n", system, "--wait=false")
    new = wait_for("the standby holding the Lease", lambda: (
        h if (h := holder(cluster, system)).startswith(standby) else None), timeout=60)
    assert not new.startswith(leader_pod)
    # The Deployment replaces the deleted pod, which comes up Ready as a standby
    wait_for("two operator pods Ready again", lambda: len(
        [p for p in pods(cluster, system) if ready(p) and p["metadata"]["name"] != leader_pod]) == 2 or None,
        timeout=120)
    assert holder(cluster, system).startswith(standby)
