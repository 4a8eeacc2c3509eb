"""The real apiserver refuses the operator's own write (a ResourceQuota allowing no Services in the namespace):
the pool's status says so with the apiserver's message, one Warning event says so however often the operator
tries again, nothing loops on errors, and once the quota is gone the pool is built and accepted."""

from __future__ import annotations

import json

import pytest

from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.pools import example

pytestmark = pytest.mark.cluster


def accepted(cluster: Cluster, namespace: str) -> dict:
    status = cluster.get("pdpool", "tiny", "-n", namespace).get("status") or {}
    return next((c for c in status.get("conditions", []) if c["type"] == "Accepted"), {})


def apply_tiny(cluster: Cluster, namespace: str) -> None:
    body = example("minimal")
    body["metadata"] = {"name": "tiny", "namespace": namespace}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))


def not_accepted(cluster: Cluster, namespace: str, reason: str) -> dict:
    """The pool's Accepted condition once it is False for `reason`."""
    cond = wait_for(f"Accepted=False with reason {reason}",
                    lambda: (c := accepted(cluster, namespace)).get("reason") == reason and c, timeout=60)
    assert cond["status"] == "False"
    return cond


def refusal_events(cluster: Cluster, namespace: str) -> list[dict]:
    events = cluster.get("events", "-n", namespace, "--field-selector", "involvedObject.kind=InferencePool")
    return [e for e in events["items"] if e["reason"] == "WriteRefused"]


def test_a_write_the_apiserver_refuses_shows_in_status_and_one_event(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-services", "namespace": namespace},
             "spec": {"hard": {"services": "0"}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(quota))
    # Quota admission enforces a quota once the quota controller has filled in its status.
    wait_for("the quota to be in force", lambda: cluster.get("resourcequota", "no-services", "-n", namespace)
             .get("status", {}).get("hard"))
    apply_tiny(cluster, namespace)

    cond = not_accepted(cluster, namespace, "WriteRefused")
    assert "apply Service tiny-router: 403 Forbidden" in cond["message"]
    assert "exceeded quota: no-services" in cond["message"]  # the apiserver's own words
    assert cluster.get("pdpool", "tiny", "-n", namespace)["status"]["phase"] == "Degraded"
    # What the quota allows was made all the same.
    assert cluster.kubectl("get", "pod", "tiny-decode-0-0", "-n", namespace, check=False).returncode == 0

    # The operator resyncs every second: let it be refused several more times, and say it only once.
    refused = operator.metric("pdfleet_reconcile_total", result="refused")
    wait_for("three more refused reconciles",
             lambda: operator.metric("pdfleet_reconcile_total", result="refused") >= refused + 3, timeout=60)
    events = refusal_events(cluster, namespace)
    assert [(e["type"], e.get("count", 1)) for e in events] == [("Warning", 1)], [e["message"] for e in events]
    assert events[0]["message"] == accepted(cluster, namespace)["message"]
    # Conflicts on the status may be retried (the pool changes under the operator), a refusal never is.
    assert "will retry: 403" not in operator.logs(), "a refused write was retried with backoff"

    cluster.kubectl("delete", "resourcequota", "no-services", "-n", namespace)
    wait_for("the pool accepted once the quota is gone",
             lambda: accepted(cluster, namespace).get("status") == "True", timeout=60)
    assert cluster.kubectl("get", "service", "tiny-router", "-n", namespace, check=False).returncode == 0
    # Writes that pass while the quota goes (some of a reconcile's, not all) are no news either.
    events = refusal_events(cluster, namespace)
    assert len(events) == 1, [(e["firstTimestamp"], e["message"]) for e in events]
