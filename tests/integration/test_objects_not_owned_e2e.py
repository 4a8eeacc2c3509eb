"""Touch only what it owns (issue 40), on the real apiserver: a Deployment, a Role and a Secret someone made under
the names a new pool's router and router key would take are left as they are (not patched, not adopted, not
deleted), the pool says which objects block it in its Accepted condition and in one Warning, nothing else of the
pool is made meanwhile, and once they are deleted the pool goes on by itself. The operator runs with the chart's
ServiceAccount token (its RBAC must allow the reads by name) and a resync of 5 minutes, so what brings the pool
back is the operator's own look at its blocked pool, not a resync."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_write_refusals import accepted, apply_tiny, not_accepted
from tests.support import scheduling
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess, running_operator, token_kubeconfig
from tests.support.release import RELEASE_NAMESPACE

pytestmark = pytest.mark.cluster

POOL_KINDS = "pods,services,deployments,serviceaccounts,roles,rolebindings,networkpolicies,poddisruptionbudgets"


def blockers(namespace: str) -> list[dict]:
    """What a person made before the pool: unlabelled, controlled by nothing."""
    meta = {"namespace": namespace, "annotations": {"made-by": "someone else"}}
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "tiny-router", **meta},
         "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "theirs"}},
                  "template": {"metadata": {"labels": {"app": "theirs"}},
                               "spec": {"containers": [{"name": "c", "image": "registry.invalid/theirs:1"}]}}}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "tiny-router", **meta},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tiny-router-key", **meta},
         "type": "Opaque", "stringData": {"password": "theirs"}},
    ]


def read(cluster: Cluster, namespace: str, kind: str, name: str) -> dict | None:
    found = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def warnings(cluster: Cluster, namespace: str) -> list[dict]:
    events = cluster.get("events", "-n", namespace, "--field-selector", "involvedObject.kind=InferencePool")
    return [e for e in events["items"] if e["reason"] == "ObjectNotOwned"]


@pytest.fixture
def own_operator(cluster: Cluster, chart: None, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    release = scheduling.shared_operator(scheduling.module_path(__file__)).release
    kubeconfig = token_kubeconfig(cluster, RELEASE_NAMESPACE, release, tmp_path / "kubeconfig")
    with running_operator(kubeconfig, tmp_path / "operator.log", "--resync-period", "300",
                          "--namespace", namespace) as op:
        yield op
        assert "Traceback" not in op.logs(), op.logs()[-5000:]
        user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{release}"
        assert f'User "{user}" cannot' not in op.logs(), "the chart's RBAC is missing a permission"


def test_objects_a_new_pool_would_take_over_are_left_alone_and_the_pool_goes_on_once_they_go(
        cluster: Cluster, own_operator: OperatorProcess, namespace: str) -> None:
    theirs = blockers(namespace)
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": theirs}))
    before = {o["kind"]: read(cluster, namespace, o["kind"], o["metadata"]["name"]) for o in theirs}
    apply_tiny(cluster, namespace)

    cond = not_accepted(cluster, namespace, "ObjectNotOwned")
    for named in ("Deployment {}/tiny-router", "Role {}/tiny-router", "Secret {}/tiny-router-key"):
        assert f"{named.format(namespace)} (no controller)" in cond["message"], cond["message"]
    assert "delete or rename each, or create the pool under another name" in cond["message"]

    # Looked at again every 10 s, and said once.
    wait_for("three blocked reconciles", lambda: own_operator.metric("pdfleet_reconcile_total", result="blocked") >= 3,
             timeout=60)
    said = warnings(cluster, namespace)
    assert [(e["type"], e.get("count", 1), e["message"]) for e in said] == [("Warning", 1, cond["message"])]
    for obj in theirs:
        now = read(cluster, namespace, obj["kind"], obj["metadata"]["name"])
        assert now is not None and now["metadata"]["resourceVersion"] == before[obj["kind"]]["metadata"][
            "resourceVersion"], f"{obj['kind']} was written"
        assert now == before[obj["kind"]] and "ownerReferences" not in now["metadata"]
    made = cluster.get(POOL_KINDS, "-n", namespace, "-l", "pdfleet.dev/pool=tiny")["items"]
    assert made == [], [f"{o['kind']} {o['metadata']['name']}" for o in made]

    for obj in theirs:
        cluster.kubectl("delete", obj["kind"], obj["metadata"]["name"], "-n", namespace, "--wait=true")
    wait_for("the pool accepted once they are gone",
             lambda: accepted(cluster, namespace).get("status") == "True", timeout=60)
    uid = cluster.get("pdpool", "tiny", "-n", namespace)["metadata"]["uid"]
    for kind, name in (("Deployment", "tiny-router"), ("Role", "tiny-router"), ("Secret", "tiny-router-key")):
        ours = wait_for(f"the pool's own {kind} {name}", lambda k=kind, n=name: read(cluster, namespace, k, n))
        assert [r["uid"] for r in ours["metadata"]["ownerReferences"] if r.get("controller")] == [uid]
    assert len(warnings(cluster, namespace)) == 1
