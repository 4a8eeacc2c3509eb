"""A pool run by the operator in a namespace that enforces Pod Security's `restricted` level, through the real
apiserver's admission (tests/integration/test_pod_security_e2e.py dry-runs each pod alone): the router's pods are
admitted as they are; the engine pods, which keep their image's user (root for SGLang's images), are refused,
and the pool says so in its status; given a user of its own (`spec.engine.runAsUser`), the pool runs there."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_write_refusals import accepted, apply_tiny, not_accepted
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster


def test_a_pool_runs_under_restricted_once_its_engines_have_a_user_of_their_own(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    apply_tiny(cluster, namespace)

    cond = not_accepted(cluster, namespace, "WriteRefused")
    assert 'violates PodSecurity "restricted:latest"' in cond["message"], cond["message"]
    assert "runAsNonRoot != true" in cond["message"], cond["message"]
    assert fleet.engine_pods(cluster, namespace, "tiny") == []
    # The router's pods, made by its ReplicaSet, pass the same admission.
    wait_for("a router pod admitted", lambda: fleet.router_pods(cluster, namespace, "tiny"), timeout=60)

    cluster.kubectl("patch", "pdpool", "tiny", "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"engine": {"runAsUser": 1000}}}))
    wait_for("Accepted=True", lambda: accepted(cluster, namespace).get("status") == "True", timeout=60)
    pods = wait_for("the engine pods admitted", lambda: (
        p if len(p := fleet.engine_pods(cluster, namespace, "tiny")) == 2 else None), timeout=60)
    assert {p["spec"]["securityContext"].get("runAsUser") for p in pods} == {1000}
    fleet.wait_ready(cluster, namespace, "tiny")
