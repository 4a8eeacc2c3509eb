"""The serving path's control plane, tried as a stranger would: a client with nothing but the router's address
can no longer list, add or remove the router's workers, while its requests are still served; the operator's
own calls carry the pool's key, which no log line, Event, status, ConfigMap or pod spec shows, and which
rotates without the operator losing hold of any router.

Everything here is real: the chart's operator RBAC, the real sglang-router 0.3.2, simulated engines behind it.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import httpx
import pytest

from pdfleet.podrunner import loadgen
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.release import RELEASE_NAMESPACE

ENGINE_METRICS_PORT = 8471  # the engines' metrics-only port, written out: a move of it shows here

pytestmark = pytest.mark.cluster

POOL = "locked"
MODEL = "qwen2.5-0.5b-instruct"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def secret_keys(cluster: Cluster, namespace: str) -> dict[str, str]:
    secret = cluster.get("secret", f"{POOL}-router-key", "-n", namespace)
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def readable_text(cluster: Cluster, namespace: str, operator: OperatorProcess) -> dict[str, str]:
    """Everything the suite can read that is not the Secret itself: every log file of the local cluster (the
    apiserver's, the pod runner's, every container's, the router's audit log among them), the operator's log,
    and the namespace's Events, ConfigMaps, pools and pods and Deployments as the API serves them."""
    texts = {str(p): p.read_text(errors="replace") for p in Path(cluster.kubeconfig.parent).rglob("*.log")}
    texts["operator log"] = operator.logs()
    for kind in ("events", "configmaps", "inferencepools", "pods", "deployments", "replicasets"):
        texts[kind] = cluster.kubectl("get", kind, "-n", namespace, "-o", "json").stdout
    return texts


def test_a_stranger_can_neither_see_nor_change_the_routers_workers_and_is_still_served(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL)
    fleet.wait_ready(cluster, namespace, POOL)
    url = fleet.router_url(cluster, namespace, POOL, workers=4)
    key = fleet.router_key(cluster, namespace, POOL)
    listed = fleet.workers(url, key)
    assert listed is not None and len(listed) == 4

    seen: list[str] = []
    with fleet.foreign_engine("127.1.9.7", 30000, seen) as stranger:
        for headers in ({}, fleet.admin("not-the-key"), {"Authorization": key}):  # none, wrong, not a bearer
            assert httpx.get(f"{url}/workers", headers=headers, timeout=10).status_code == 401
            add = httpx.post(f"{url}/workers", json={"url": stranger, "worker_type": "decode"}, headers=headers,
                             timeout=10)
            assert add.status_code == 401, add.text
            gone = httpx.delete(f"{url}/workers/{listed[0]['id']}", headers=headers, timeout=10)
            assert gone.status_code == 401, gone.text
            for path in ("/flush_cache", "/get_loads"):
                assert httpx.post(f"{url}{path}", headers=headers, timeout=10).status_code == 401

        # Clients need no key, and are served by the pool's engines only.
        for n in range(6):
            r = httpx.post(f"{url}/generate", json={"text": f"request {n}", "sampling_params": {"max_new_tokens": 4}},
                           timeout=30)
            assert r.status_code == 200, r.text
        chat = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
        assert chat.status_code == 200, chat.text
        assert seen == [], "the stranger's server was contacted"
        after = fleet.workers(url, key)
        assert after is not None and sorted(w["url"] for w in after) == sorted(w["url"] for w in listed)

    # The router's audit log names the operator as the caller of its worker API, and the stranger as denied.
    router = next(p for p in fleet.router_pods(cluster, namespace, POOL) if f"//{p['status']['podIP']}:" in url)
    log = ANSI.sub("", (cluster.kubeconfig.parent / "pods" / namespace / router["metadata"]["name"] /
                        "router.log").read_text())
    audits = [line for line in log.splitlines() if "control_plane_audit" in line]
    assert any("principal=pdfleet-operator" in a and "path=/workers" in a and "outcome=success" in a
               for a in audits), "no audited call of the operator"
    assert any("principal=unauthenticated" in a and "method=POST path=/workers" in a and "outcome=denied" in a
               for a in audits)

    # The key is in the Secret and the router process only.
    keys = secret_keys(cluster, namespace)
    assert keys and all(len(v) >= 32 for v in keys.values())
    for where, text in readable_text(cluster, namespace, operator).items():
        for name, value in keys.items():
            assert value not in text, f"router key {name} appears in {where}"


def test_least_privilege_the_router_reads_pods_only_and_only_its_pods_hold_the_key(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={"replicas": 1})
    fleet.wait_ready(cluster, namespace, POOL)
    fleet.router_url(cluster, namespace, POOL, workers=2)
    router_sa = f"system:serviceaccount:{namespace}:{POOL}-router"

    def can(verb: str, resource: str) -> bool:
        answer = cluster.kubectl("auth", "can-i", verb, resource, "-n", namespace, f"--as={router_sa}", check=False)
        return answer.stdout.strip() == "yes"

    assert all(can(v, "pods") for v in ("get", "list", "watch"))
    for verb, resource in [("create", "pods"), ("delete", "pods"), ("patch", "pods"), ("get", "secrets"),
                           ("list", "secrets"), ("get", "configmaps"), ("list", "services"),
                           ("get", "inferencepools.pdfleet.dev"), ("create", "pods/exec")]:
        assert not can(verb, resource), f"the router's ServiceAccount may {verb} {resource}"

    secret = f"{POOL}-router-key"
    holders = {p["metadata"]["name"] for p in cluster.get("pods", "-n", namespace)["items"]
               if secret in json.dumps(p["spec"])}
    routers = {p["metadata"]["name"] for p in fleet.router_pods(cluster, namespace, POOL)}
    assert holders == routers and routers, (holders, routers)
    owner = cluster.get("secret", secret, "-n", namespace)["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"]) for o in owner] == [("InferencePool", POOL)]


def test_a_key_rotation_under_load_fails_no_request_and_the_operator_keeps_its_hold_on_the_router(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={"replicas": 1})
    fleet.wait_ready(cluster, namespace, POOL)
    url = fleet.router_url(cluster, namespace, POOL, workers=2)
    first = fleet.router_key(cluster, namespace, POOL)
    wait_for("both routers Ready", lambda: len(loadgen.ready_urls(fleet.router_pods(cluster, namespace, POOL))) == 2,
             timeout=120)
    old_pods = {p["metadata"]["name"] for p in fleet.router_pods(cluster, namespace, POOL)}

    def rolled() -> str | None:
        pods = fleet.router_pods(cluster, namespace, POOL)
        if len(pods) != len(old_pods) or {p["metadata"]["name"] for p in pods} & old_pods or \
                len(loadgen.ready_urls(pods)) != len(pods):
            return None
        return fleet.router_url(cluster, namespace, POOL, workers=2)

    # Clients reach the routers as through a Service: new requests go to Ready, not terminating router pods.
    with fleet.ready_routers(cluster, namespace, POOL) as endpoints, \
            fleet.steady_load(url, model=MODEL, endpoints=lambda: endpoints) as load:
        wait_for("the load served", lambda: load.tally.summary()["ok"] >= 20, timeout=60)
        cluster.kubectl("annotate", "pdpool", POOL, "-n", namespace, "--overwrite",
                        "pdfleet.dev/rotate-router-key=2026-12-03T03:30:00Z")
        wait_for("a RouterKeyRotated event", lambda: fleet.events(cluster, namespace, POOL, "RouterKeyRotated"),
                 timeout=30)
        url = wait_for("every router restarted onto the new key", rolled, timeout=180, interval=1)
        served = load.tally.summary()["ok"]
        wait_for("the new router serving", lambda: load.tally.summary()["ok"] >= served + 20, timeout=60)
    summary = load.tally.summary()
    assert summary["failed"] == 0, summary["failures"]
    assert url in load.used and len(load.used) >= 2, "the load went through the old router and the new one"

    second = fleet.router_key(cluster, namespace, POOL)
    assert second != first
    assert fleet.workers(url, first) is None, "the old key still opens the new router"
    wait_for("the old key dropped from the Secret", lambda: first not in secret_keys(cluster, namespace).values(),
             timeout=60)

    # The operator calls the new router with the new key: a registration it does not hold is removed.
    with fleet.foreign_engine("127.1.9.6", 30000) as stray:
        r = httpx.post(f"{url}/workers", json={"url": stray, "worker_type": "decode"}, headers=fleet.admin(second),
                       timeout=10)
        assert r.status_code < 300, r.text
        wait_for("the router to register it", lambda: stray in [w["url"] for w in fleet.workers(url, second) or []],
                 timeout=60)
        wait_for("the operator to remove it",
                 lambda: stray not in [w["url"] for w in fleet.workers(url, second) or [stray]], timeout=30)


def selected(cluster: Cluster, namespace: str, selector: dict) -> set[str]:
    """The pods a LabelSelector selects, as the apiserver's own label selection answers."""
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    terms += [e["key"] for e in selector.get("matchExpressions") or [] if e["operator"] == "Exists"]
    assert len(terms) == len(selector.get("matchLabels") or {}) + len(selector.get("matchExpressions") or [])
    return {p["metadata"]["name"] for p in cluster.get("pods", "-n", namespace, "-l", ",".join(terms))["items"]}


def test_the_pools_network_policies_are_accepted_and_select_its_engines_and_router(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    """The local control plane does not enforce NetworkPolicies: this checks what the operator applied (the
    apiserver validated it) against the real pods; who each rule admits is evaluated in
    tests/unit/test_network_policy.py."""
    fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={"replicas": 1})
    fleet.wait_ready(cluster, namespace, POOL)
    policies = {p["metadata"]["name"]: p for p in cluster.get("networkpolicies", "-n", namespace)["items"]}
    assert sorted(policies) == [f"{POOL}-engines", f"{POOL}-router"]
    engines = {p["metadata"]["name"] for p in fleet.engine_pods(cluster, namespace, POOL)}
    routers = {p["metadata"]["name"] for p in fleet.router_pods(cluster, namespace, POOL)}
    assert selected(cluster, namespace, policies[f"{POOL}-engines"]["spec"]["podSelector"]) == engines
    assert selected(cluster, namespace, policies[f"{POOL}-router"]["spec"]["podSelector"]) == routers
    engine_rules = policies[f"{POOL}-engines"]["spec"]["ingress"]
    assert selected(cluster, namespace, engine_rules[0]["from"][0]["podSelector"]) == routers
    assert selected(cluster, namespace, engine_rules[1]["from"][0]["podSelector"]) == engines
    operator_peer = engine_rules[2]["from"][0]
    assert operator_peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": RELEASE_NAMESPACE}
    assert [p["port"] for p in engine_rules[2]["ports"]] == [8470], "the agent port, to the operator only"
    # What the operator applied passes the apiserver's validation again as a client would send it.
    for policy in policies.values():
        body = {k: policy[k] for k in ("apiVersion", "kind", "spec")} | {"metadata": {
            "name": policy["metadata"]["name"] + "-copy", "namespace": namespace}}
        cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(body))

    # The engines' metrics-only port: open to the pool's namespace by default (no metricsFrom) and the operator, and
    # on every engine pod it answers SGLang's metrics, through the launcher's relay, and nothing else of the engine.
    [metrics_rule] = [r for r in engine_rules if [p["port"] for p in r["ports"]] == [ENGINE_METRICS_PORT]]
    assert metrics_rule["from"][0] == {"podSelector": {}}
    assert metrics_rule["from"][1] == operator_peer
    for pod in fleet.engine_pods(cluster, namespace, POOL):
        ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
        assert ports["metrics"] == ENGINE_METRICS_PORT
        relay = f"http://{pod['status']['podIP']}:{ENGINE_METRICS_PORT}"
        code, text = fleet.http_get(relay + "/metrics", timeout=10)
        assert code == 200 and "\nsglang:num_running_reqs{" in text, (code, text[:300])
        for path in ("/flush_cache", "/server_info", "/v1/models"):
            assert fleet.http_get(relay + path)[0] == 404, path
        assert httpx.post(relay + "/flush_cache", timeout=10).status_code == 404
        assert httpx.post(relay + "/metrics", timeout=10).status_code == 405

    # Switched off for the pool, its policies go.
    cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"networkPolicy": {"enabled": False}}}))
    wait_for("the policies removed", lambda: not cluster.get("networkpolicies", "-n", namespace)["items"],
             timeout=30)
