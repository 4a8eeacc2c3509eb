"""Kueue for the gang-scheduling tests: the real controller manager, started by hack/kueue.py against the local
control plane once per test run, and the objects those tests give it (fake GPU nodes of their own, a
ResourceFlavor on them, a ClusterQueue with a GPU quota, a LocalQueue).

`make cluster-up` starts Kueue with the rest of the local cluster; the `kueue` fixture checks that it runs, and
starts it (stopping it at the run's end) only against a local cluster brought up without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
KUEUE = ROOT / "hack" / "kueue.py"
API = "kueue.x-k8s.io/v1beta2"
# Kueue v0.17.0's names (pkg/controller/constants, pkg/controller/jobs/pod/constants).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
NODES_LABEL = "pdfleet.dev/kueue-test-nodes"
STARTED_BY = Path(tempfile.gettempdir()) / "pdfleet-kueue-started-by-test-run"
RUN_ID = "PDFLEET_TEST_RUN"


def _hack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(KUEUE), *args], text=True, capture_output=True, timeout=300)


def ensure_running(cluster: Cluster) -> None:
    """Kueue runs against the cluster, or the test fails saying what to build or install."""
    if not cluster.is_local:
        crd = cluster.kubectl("get", "crd", "clusterqueues.kueue.x-k8s.io", check=False)
        if crd.returncode != 0:
            pytest.fail("these tests need Kueue v0.17 with its pod integration on, in the cluster PDFLEET_KUBECONFIG "
                        "names: install it there (its release manifests)", pytrace=False)
        return
    with (Path(tempfile.gettempdir()) / "pdfleet-kueue-startup.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _hack("status").returncode != 0:
            STARTED_BY.write_text(os.environ.get(RUN_ID, ""))
        up = _hack("up")
    if up.returncode != 0:
        pytest.fail(f"could not start Kueue (hack/kueue.py up):\n{up.stderr}", pytrace=False)


def stop_if_started_by_this_run() -> None:
    with contextlib.suppress(FileNotFoundError):
        if STARTED_BY.read_text() == os.environ.get(RUN_ID, ""):
            STARTED_BY.unlink()
            _hack("down")


@contextlib.contextmanager
def gpu_nodes(cluster: Cluster, namespace: str, count: int) -> Iterator[list[str]]:
    """`count` empty 8-GPU fake nodes, labelled and tainted for this test alone: the other tests of the run keep
    the cluster's own GPU nodes busy, and Kueue's quota must here equal what these nodes hold."""
    base = cluster.get("nodes", "-l", "pdfleet.dev/local-cluster=true,nvidia.com/gpu.present=true")["items"][0]
    subnet = zlib.crc32(namespace.encode()) % 60 * 4  # 127.3.N.0/24: none of the cluster's own or other tests'
    names = [f"{namespace}-gpu-{i}" for i in range(count)]
    nodes = [{
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": base["metadata"]["labels"] | {"kubernetes.io/hostname": name, NODES_LABEL: namespace}},
        "spec": {"podCIDR": f"127.3.{subnet + i}.0/24", "podCIDRs": [f"127.3.{subnet + i}.0/24"],
                 "taints": [*base["spec"].get("taints", []),
                            {"key": NODES_LABEL, "value": namespace, "effect": "NoSchedule"}]},
        "status": {"capacity": base["status"]["capacity"], "allocatable": base["status"]["allocatable"]},
    } for i, name in enumerate(names)]
    cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    try:
        yield names
    finally:
        cluster.kubectl("delete", "node", *names, "--wait=false", "--ignore-not-found", check=False)


def queue_objects(namespace: str, gpus: int, topology: str | None = None) -> list[dict[str, Any]]:
    """A ResourceFlavor on the test's nodes (Kueue adds its node selector and tolerations to a pod it admits), a
    ClusterQueue of `gpus` nvidia.com/gpu for this namespace alone, and the LocalQueue `gpus` in it. With
    `topology`, the flavor is topology-aware: a Topology of one level, the node."""
    flavor: dict[str, Any] = {
        "nodeLabels": {NODES_LABEL: namespace},
        "tolerations": [{"key": NODES_LABEL, "operator": "Equal", "value": namespace, "effect": "NoSchedule"},
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    objects: list[dict[str, Any]] = []
    if topology:
        objects.append({"apiVersion": API, "kind": "Topology", "metadata": {"name": topology},
                        "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]}})
        flavor["topologyName"] = topology
    return [*objects,
            {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": namespace}, "spec": flavor},
            {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": namespace}, "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                    {"name": namespace, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}},
            {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": "gpus", "namespace": namespace},
             "spec": {"clusterQueue": namespace}}]


@contextlib.contextmanager
def queues(cluster: Cluster, namespace: str, gpus: int, topology: str | None = None) -> Iterator[None]:
    objects = queue_objects(namespace, gpus, topology)
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    try:
        yield
    finally:
        # The namespace's pods and workloads first: Kueue holds both by its finalizers, and keeps a ClusterQueue
        # with workloads in it. A deleted pod of a group that may still retry (the default) keeps Kueue's
        # finalizer until the group's Workload goes, so the Workloads are deleted too.
        cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "workloads.kueue.x-k8s.io", "--all", "-n", namespace, "--wait=true",
                        "--timeout=60s", check=False)
        cluster.kubectl("wait", "--for=delete", "pods", "--all", "-n", namespace, "--timeout=60s", check=False)
        for obj in reversed(objects):
            ns = ["-n", obj["metadata"]["namespace"]] if "namespace" in obj["metadata"] else []
            cluster.kubectl("delete", f"{obj['kind'].lower()}.kueue.x-k8s.io", obj["metadata"]["name"], *ns,
                            "--wait=false", "--ignore-not-found", check=False)


def gpu_pod(name: str, namespace: str, gpus: int, *, queue: str | None = "gpus", group: str | None = None,
            group_size: int = 0, annotations: dict[str, str] | None = None,
            tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A plain pod asking for `gpus` GPUs; in Kueue's pod group `group` of `group_size` pods when given."""
    labels: dict[str, str] = {"app": "kueue-gang-test"}
    notes = dict(annotations or {})
    if queue:
        labels[QUEUE_LABEL] = queue
    if group:
        labels[GROUP_LABEL] = group
        notes[GROUP_COUNT_ANNOTATION] = str(group_size)
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "registry.invalid/gpu-burner:1",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
    }
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": notes},
            "spec": spec}


def gated(pod: dict[str, Any]) -> bool:
    return any(g["name"] == ADMISSION_GATE for g in pod["spec"].get("schedulingGates", []))


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)
