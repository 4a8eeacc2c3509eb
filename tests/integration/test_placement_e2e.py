"""A role's placement carried out by the real kube-scheduler (issue 26, "Topology"): `scheduling.spread` puts a
role's engine groups in different domains of a node label, and `scheduling.near` puts a prefill where its decode
pods run. Each test adds fake 8-GPU nodes of its own (kwok), labelled with a test-only zone label and tainted so
that only its pods go there, and reads where the scheduler bound the pods (`spec.nodeName` and that node's
zone), not what was rendered (tests/unit/test_render_placement.py). Each setup is one where the scheduler's other
scores would put the pods elsewhere, so only the placement option can explain where they land."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import fleet
from tests.support import kueue as kq
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

ZONE = "pdfleet.dev/test-zone"
NO_NODE = "pdfleet.dev/test-no-node"  # a node label no node has: a pod that asks for it waits unscheduled


@contextlib.contextmanager
def zoned_nodes(cluster: Cluster, namespace: str, zones: list[str]) -> Iterator[list[str]]:
    """Fresh fake GPU nodes, the i-th in zone `zones[i]`, tainted and labelled for this test alone
    (tests/support/kueue.gpu_nodes), so the zone label is on no node another test uses; deleted at the end."""
    with kq.gpu_nodes(cluster, namespace, len(zones)) as nodes:
        for node, zone in zip(nodes, zones, strict=True):
            cluster.kubectl("label", "node", node, f"{ZONE}={zone}")
        yield nodes


def on_test_nodes(namespace: str, **more: Any) -> dict[str, Any]:
    """A role's `scheduling` that keeps its pods on the test's nodes (their label, and their taint tolerated)."""
    return {"nodeSelector": {kq.NODES_LABEL: namespace},
            "tolerations": [{"key": kq.NODES_LABEL, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}],
            **more}


def filler(cluster: Cluster, namespace: str, node: str) -> None:
    """A plain pod holding half of `node`'s CPU (kwok plays it): kube-scheduler's resource scores then rank that
    node below the empty ones, the tie-break the tests want to overrule."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"filler-{node}", "namespace": namespace},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "filler",
                                                     "resources": {"requests": {"cpu": "32", "memory": "256Gi"}}}]}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))


def zone_of(cluster: Cluster, node: str) -> str:
    return cluster.get("node", node)["metadata"]["labels"][ZONE]


def bound(cluster: Cluster, namespace: str, role: str, count: int) -> list[dict[str, Any]] | None:
    pods = [p for p in fleet.engine_pods(cluster, namespace, "placed", role=role)
            if not p["metadata"].get("deletionTimestamp")]
    return pods if len(pods) == count and all(p["spec"].get("nodeName") for p in pods) else None


def test_a_required_spread_puts_the_decode_groups_in_different_zones(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """Zone a is one node, half its CPU held by another pod; zone b two empty nodes. Left to its scores,
    kube-scheduler would put both decode groups in zone b (the emptier nodes, one group each); the required
    spread (maxSkew 1 over the zone label) sends the second group to zone a."""
    with zoned_nodes(cluster, namespace, ["a", "b", "b"]) as nodes:
        filler(cluster, namespace, nodes[0])
        spread = {"nodeLabel": ZONE, "mode": "Required"}
        fleet.apply_pool(cluster, namespace, "placed", prefill={"replicas": 1},
                         decode={"replicas": 2, "scheduling": on_test_nodes(namespace, spread=spread)})
        pods = wait_for("both decode groups bound", lambda: bound(cluster, namespace, "decode", 2),
                        timeout=60, interval=0.5)
        zones = {p["metadata"]["name"]: zone_of(cluster, p["spec"]["nodeName"]) for p in pods}
        assert sorted(zones.values()) == ["a", "b"], zones
        cluster.kubectl("delete", "pdpool", "placed", "-n", namespace, "--wait=true", "--timeout=60s")


def test_a_prefill_near_decode_lands_in_the_zone_of_the_decode_pod(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """One decode group, held to zone a (its one node) by a node selector; prefill with `near: {role: decode}`
    over the zone label. The prefill is first held unscheduled by a node label no node has, and once the decode
    pod is bound the spec drops that label: the prefill group is replaced by a pod every node admits, placed
    with the decode pod in view. (Labelling the nodes instead would open them one at a time, and the scheduler
    may place the waiting pod on the first one opened.) Zone b's two nodes are empty, zone a's holds the decode
    pod and half its CPU is held by another pod, so every other score ranks zone b first: without `near` the
    prefill lands there (the decode pod alone is too small to count: the resource scores round it away, and
    the prefill landed on its node once in three tries); the preferred pod affinity (weight 100, times
    InterPodAffinity's weight of 2 in the default profile) outweighs that and puts it in zone a."""
    with zoned_nodes(cluster, namespace, ["a", "b", "b"]) as nodes:
        filler(cluster, namespace, nodes[0])
        near = {"role": "decode", "nodeLabel": ZONE}
        decode = {"replicas": 1, "scheduling": on_test_nodes(namespace)}
        decode["scheduling"]["nodeSelector"][ZONE] = "a"
        held = on_test_nodes(namespace, near=near)
        held["nodeSelector"][NO_NODE] = "true"
        fleet.apply_pool(cluster, namespace, "placed", prefill={"replicas": 1, "scheduling": held}, decode=decode)
        [decode_pod] = wait_for("the decode pod bound", lambda: bound(cluster, namespace, "decode", 1),
                                timeout=60, interval=0.5)
        assert decode_pod["spec"]["nodeName"] == nodes[0]
        [waiting] = wait_for("the prefill pod created", lambda: fleet.engine_pods(
            cluster, namespace, "placed", role="prefill"), timeout=30, interval=0.5)
        assert not waiting["spec"].get("nodeName"), "held back until the decode pod is bound"

        fleet.apply_pool(cluster, namespace, "placed", decode=decode,
                         prefill={"replicas": 1, "scheduling": on_test_nodes(namespace, near=near)})
        [prefill_pod] = wait_for("the prefill pod bound", lambda: bound(cluster, namespace, "prefill", 1),
                                 timeout=60, interval=0.5)
        assert NO_NODE not in prefill_pod["spec"]["nodeSelector"]
        assert zone_of(cluster, prefill_pod["spec"]["nodeName"]) == "a", prefill_pod["spec"]["nodeName"]
        cluster.kubectl("delete", "pdpool", "placed", "-n", namespace, "--wait=true", "--timeout=60s")
