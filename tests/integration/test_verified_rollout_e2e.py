"""End to end: verified rollouts on the local cluster. The operator runs as in `test_operator_e2e.py`, `pdfleet-sim`
plays every pod, and the engine simulator's ranks report their event loop through the real rank agents and its
/server_info is SGLang's own resolved ServerArgs: the gates read what a real engine would show.

A wrong engine is asked for the way a new revision would bring one: `PDFLEET_SIM_FAULT=wrong-event-loop` in
`spec.engine.env` is part of the revision, so only the replacing pods report the other loop (faults.py).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest

from pdfleet.runtime.patches import catalogue
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

# toolCallCanary: switched off by default; bake: this module rolls out without one (fleet.MECHANICS)
CANARY = {"toolCallCanary": "Skipped", "bake": "Skipped"}

pytestmark = pytest.mark.cluster

POOL = "verified"
ONE_AND_ONE = {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}


def status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return fleet.pool(cluster, namespace, POOL).get("status") or {}


def verified(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return fleet.conditions(cluster, namespace, POOL).get("RolloutVerified") or {}


def wait_verified(cluster: Cluster, namespace: str, *, revision_not: str | None = None) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        now = status(cluster, namespace)
        ok = (fleet.conditions_of(now).get("RolloutVerified") or {}).get("status") == "True" and \
            now.get("currentRevision") and \
            now.get("currentRevision") == now.get("updateRevision") != revision_not
        return now if ok else None
    return wait_for("the pool's rollout verified", done, timeout=180, interval=0.5)


def patch_engine(cluster: Cluster, namespace: str, engine: dict[str, Any]) -> None:
    cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"engine": engine}}))


def loops(now: dict[str, Any]) -> dict[str, str | None]:
    return {g["role"]: g.get("eventLoop") for g in now["groups"]}


def test_a_pool_is_verified_then_rolls_out_verified_to_the_normal_loop_and_stops_at_a_wrong_one(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL, **ONE_AND_ONE)
    first = wait_verified(cluster, namespace)
    assert first["phase"] == "Ready"
    assert loops(first) == {"prefill": "event_loop_overlap_disagg_prefill",
                            "decode": "event_loop_overlap_disagg_decode"}
    # A pool that names no patches runs the recommended fixes: the status says so, every pod is started with
    # them, and every pod's rank agent reports its engine applied them (the patches gate).
    recommended = list(catalogue.recommended_for(fleet.pool(cluster, namespace, POOL)["spec"]["engine"]
                                                 ["sglangVersion"]))
    assert recommended and first["patches"]["effective"] == recommended == first["patches"]["recommended"]
    assert first["patches"]["policy"] == "Recommended" and not first["patches"].get("held")
    for pod in fleet.engine_pods(cluster, namespace, POOL):
        args = pod["spec"]["containers"][0]["args"]
        assert [a.removeprefix("--patch=") for a in args if a.startswith("--patch=")] == recommended
    for group in first["groups"]:
        assert group["verifiedRevision"] == group["revision"]
        assert {g["name"]: g["state"] for g in group["verification"]["gates"]} == \
            {"eventLoop": "Passed", "patches": "Passed", "serverArgs": "Passed", **CANARY}
        patches_gate = next(g for g in group["verification"]["gates"] if g["name"] == "patches")
        assert patches_gate["message"] == f"every pod's engine applied {', '.join(recommended)}"
    assert fleet.events(cluster, namespace, POOL, "RecommendedPatchesOptedOut") == []

    patch_engine(cluster, namespace, {"overlapSchedule": "Disabled"})
    second = wait_verified(cluster, namespace, revision_not=first["currentRevision"])
    assert loops(second) == {"prefill": "event_loop_normal_disagg_prefill",
                             "decode": "event_loop_normal_disagg_decode"}
    assert fleet.events(cluster, namespace, POOL, "RolloutGateFailed") == []

    # The next revision's engines report the other loop: decode (replaced first) fails its gate.
    prefill_pods = {p["metadata"]["uid"] for p in fleet.engine_pods(cluster, namespace, POOL, role="prefill")}
    patch_engine(cluster, namespace, {"env": [{"name": "PDFLEET_SIM_FAULT", "value": "wrong-event-loop"}]})

    def failed() -> dict[str, Any] | None:
        cond = verified(cluster, namespace)
        return cond if cond.get("status") == "False" else None
    cond = wait_for("RolloutVerified False", failed, timeout=180, interval=0.5)
    assert cond["reason"] == "GateFailed"
    assert "gate eventLoop failed for decode group verified-decode-0" in cond["message"]
    assert "expected event_loop_normal_disagg_decode, seen event_loop_overlap_disagg_decode" in cond["message"]
    now = status(cluster, namespace)
    assert now["phase"] == "Failed"
    assert now["currentRevision"] == second["currentRevision"], "currentRevision stays at the last verified one"

    # The rollout holds: the prefill group keeps its pods, and the failure is announced once.
    wait_for("one RolloutGateFailed Warning",
             lambda: len(fleet.events(cluster, namespace, POOL, "RolloutGateFailed")) == 1, timeout=30)
    # The failed group is left serving: judged Healthy on the loop it runs, not restarted.
    wait_for("the failed decode group judged Healthy", lambda: fleet.group_status(
        cluster, namespace, POOL, "verified-decode-0").get("verdict") == "Healthy", timeout=30, interval=0.5)
    assert {p["metadata"]["uid"] for p in fleet.engine_pods(cluster, namespace, POOL, role="prefill")} == \
        prefill_pods
    [warning] = fleet.events(cluster, namespace, POOL, "RolloutGateFailed")
    assert warning["type"] == "Warning" and warning["count"] == 1
    assert status(cluster, namespace)["phase"] == "Failed"


def test_a_pool_that_opts_out_of_the_recommended_fixes_runs_without_them_and_a_warning_names_them(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    body = fleet.pool_manifest(namespace, POOL, engine={"patchPolicy": "Explicit", "patches": ["abort-consensus"]},
                               **ONE_AND_ONE)
    recommended = list(catalogue.recommended_for(body["spec"]["engine"]["sglangVersion"]))
    lacking = [p for p in recommended if p != "abort-consensus"]
    # Admission warns and admits: the chart's warn-only policy (in force once the apiserver has loaded it, which a
    # server-side dry run shows) makes kubectl print what the pool lacks; a pool at its defaults gets no warning.
    says = f"spec.engine.patchPolicy: Explicit runs the engines of this pool without the recommended fixes " \
           f"{', '.join(lacking)} for SGLang {body['spec']['engine']['sglangVersion']}"
    manifest = json.dumps(body)
    wait_for("the admission policy to warn", lambda: says in cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=manifest).stderr, timeout=60)
    default = fleet.pool_manifest(namespace, "defaults", **ONE_AND_ONE)
    assert "Warning" not in cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(default)).stderr
    applied = cluster.kubectl("apply", "-f", "-", input=manifest)
    # kubectl prints: Warning: Validation failed for ValidatingAdmissionPolicy ... with binding ...: <message>
    assert applied.stderr.startswith("Warning: ") and says in applied.stderr and "created" in applied.stdout
    for policy in cluster.get("validatingadmissionpolicies")["items"]:
        if policy["metadata"]["name"].endswith("-pool-warnings"):
            assert not policy.get("status", {}).get("typeChecking", {}).get("expressionWarnings"), policy["status"]

    now = wait_verified(cluster, namespace)
    assert now["patches"]["effective"] == ["abort-consensus"] and now["patches"]["optedOut"] == lacking
    for group in now["groups"]:
        gate = next(g for g in group["verification"]["gates"] if g["name"] == "patches")
        assert (gate["state"], gate["message"]) == ("Passed", "every pod's engine applied abort-consensus")
    (warning,) = fleet.events(cluster, namespace, POOL, "RecommendedPatchesOptedOut")
    assert warning["type"] == "Warning"
    assert f"without the recommended fixes {', '.join(lacking)}," in warning["message"]


def test_a_token_from_a_secret_starts_the_engines_and_nothing_the_operator_writes_or_logs_holds_it(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    token = "hf_" + secrets.token_hex(16)
    from_secret = {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]}

    # A literal credential is admitted with a warning that says where it ends up; the Secret's key is not warned.
    literal = fleet.pool_manifest(namespace, POOL, engine={"env": [{"name": "HF_TOKEN", "value": "hf_x"}]},
                                  **ONE_AND_ONE)
    wait_for("the admission policy to warn of a literal credential", lambda: "HF_TOKEN look like credentials" in
             cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(literal)).stderr, timeout=60)
    router_literal = fleet.pool_manifest(namespace, POOL, router={"env": [{"name": "OTLP_TOKEN", "value": "t"}]},
                                         **ONE_AND_ONE)
    assert "spec.router.env: OTLP_TOKEN look like credentials" in cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(router_literal)).stderr
    referenced = fleet.pool_manifest(namespace, POOL, engine=from_secret, **ONE_AND_ONE)
    assert "Warning" not in cluster.kubectl("apply", "--dry-run=server", "-f", "-",
                                            input=json.dumps(referenced)).stderr

    # The Secret is missing: the engines do not start, and their pods say why (kubelet's words).
    cluster.kubectl("apply", "-f", "-", input=json.dumps(referenced))
    wait_for("an engine pod saying which Secret it lacks", lambda: any(
        'secret \\"hf\\" not found' in json.dumps(p.get("status", {}))
        for p in fleet.engine_pods(cluster, namespace, POOL)), timeout=120)

    cluster.kubectl("create", "secret", "generic", "hf", "-n", namespace, f"--from-literal=token={token}")
    now = wait_verified(cluster, namespace)
    assert now["phase"] == "Ready"
    for pod in fleet.engine_pods(cluster, namespace, POOL):
        [engine] = [c for c in pod["spec"]["containers"] if c["name"] == "engine"]
        assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in engine["env"]
    written = {
        "the pool (spec, annotations, status)": json.dumps(fleet.pool(cluster, namespace, POOL)),
        "the namespace's Events": json.dumps(cluster.get("events", "-n", namespace)),
        "the pods, ConfigMaps and Deployments": json.dumps(cluster.get("pods,configmaps,deployments", "-n", namespace)),
        "the operator's log": operator.logs(),
    }
    assert [where for where, text in written.items() if token in text] == []
