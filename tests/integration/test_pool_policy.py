"""The pool policy (issue 40) on the real apiserver: a table of hostile pools (host folders, a priority class, a
toleration of every taint, an image from elsewhere, engines as root where the policy requires non-root), each
refused at `kubectl apply` by the chart's ValidatingAdmissionPolicy with the field and the policy named, and nothing
of it created; each admitted once the policy allows it. Pools admitted that way (a policy tightened later, a cluster
without admission policies) are refused by the operator on reconcile (Accepted=False ForbiddenByPolicy, one Warning
each, nothing created), and run once its flags allow them.

The policy is the chart's own template, rendered by the real helm from poolPolicy values and bound to this test's
namespace alone (the suite's shared release allows anything: tests/integration/conftest.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet.operator.api.admission_template import VAP_API
from tests.support import fleet, scheduling
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess, running_operator, token_kubeconfig
from tests.support.release import RELEASE_NAMESPACE

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
FLEET_IMAGE = fleet.pool_manifest("ns", "x")["spec"]["engine"]["image"]  # lmsysorg/sglang:<tag>
FLEET_REPOSITORY = FLEET_IMAGE.rsplit(":", 1)[0]



def host_path(path: str) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        spec["model"]["source"] = {"hostPath": {"path": path}}  # one of path, pvc, hostPath: the example's goes
    return change


def scheduling_of(role: str, **values: Any) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        spec[role].setdefault("scheduling", {}).update(values)
    return change


def as_image_user(spec: dict[str, Any]) -> None:
    del spec["engine"]["runAsUser"]


def engine_image(image: str) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        spec["engine"]["image"] = image
    return change


# name -> (what makes the fleet's pool hostile, the field refused)
HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "root": (host_path("/"), "spec.model.source.hostPath.path"),
    "containerd": (host_path("/run/containerd"), "spec.model.source.hostPath.path"),
    "kubelet": (host_path("/var/lib/kubelet"), "spec.model.source.hostPath.path"),
    "critical": (scheduling_of("decode", priorityClassName="system-node-critical"),
                 "spec.decode.scheduling.priorityClassName"),
    "every-taint": (scheduling_of("prefill", tolerations=[{"operator": "Exists"}]),
                    "spec.prefill.scheduling.tolerations"),
    "miner": (engine_image("evil.example/miner:1"), "spec.engine.image"),
    "as-root": (as_image_user, "spec.engine.runAsUser"),
}
# The chart's defaults, with images held to the fleet's repository.
STRICT = {"imagePrefixes": [FLEET_REPOSITORY], "requireNonRootEngines": True}
ALLOWING = {"hostPathPrefixes": ["/"], "priorityClasses": ["system-node-critical"], "tolerationKeys": ["*"],
            "imagePrefixes": [FLEET_REPOSITORY, "evil.example/"]}


def manifest(namespace: str, name: str, **extra: Any) -> dict[str, Any]:
    body = fleet.pool_manifest(namespace, name, router={"replicas": 0}, prefill={"replicas": 1},
                               decode={"replicas": 1}, **extra)
    body["spec"]["engine"]["runAsUser"] = 1000  # each pool asks for one thing too many, not for root besides
    HOSTILE[name][0](body["spec"])
    return body


def policy_objects(cluster: Cluster, namespace: str, values: dict[str, Any], tag: str) -> list[dict[str, Any]]:
    """The chart's pool policy for `values`, named for this test and bound to `namespace` only."""
    rendered = cluster.helm("template", "pdfleet", str(ROOT / "charts" / "pdfleet"), "--namespace", "pdfleet-system",
                            "--api-versions", VAP_API, "--show-only", "templates/pool-policy.yaml",
                            "--set-json", f"poolPolicy={json.dumps(values)}",
                            "--set-json", f"watchNamespaces={json.dumps([namespace])}").stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    name = f"test-{namespace}-{tag}"
    for doc in docs:
        doc["metadata"]["name"] = name
        if doc["kind"] == "ValidatingAdmissionPolicyBinding":
            doc["spec"]["policyName"] = name
    return docs


@pytest.fixture
def admission(cluster: Cluster, namespace: str) -> Iterator[Any]:
    """Puts the chart's policy for given values in force in `namespace` (replacing the one before), once the
    apiserver refuses a sentinel pool with that policy's words."""
    applied: list[dict[str, Any]] = []

    def enforce(values: dict[str, Any], tag: str, sentinel: dict[str, Any], says: str) -> None:
        for old in applied:
            cluster.kubectl("delete", old["kind"], old["metadata"]["name"], "--ignore-not-found")
        applied[:] = policy_objects(cluster, namespace, values, tag)
        cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": applied}))
        wait_for(f"the {tag} pool policy in force", lambda: says in cluster.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(sentinel), check=False).stderr, timeout=60)
        [policy] = [d for d in applied if d["kind"] == "ValidatingAdmissionPolicy"]
        checked = cluster.get("validatingadmissionpolicy", policy["metadata"]["name"]).get("status", {})
        assert not checked.get("typeChecking", {}).get("expressionWarnings"), checked

    yield enforce
    for old in applied:
        cluster.kubectl("delete", old["kind"], old["metadata"]["name"], "--ignore-not-found", check=False)


def operator_with(cluster: Cluster, namespace: str, tmp: Path,
                  *flags: str) -> contextlib.AbstractContextManager[OperatorProcess]:
    release = scheduling.shared_operator(scheduling.module_path(__file__)).release
    kubeconfig = token_kubeconfig(cluster, RELEASE_NAMESPACE, release, tmp / "kubeconfig")
    return running_operator(kubeconfig, tmp / f"operator-{len(list(tmp.glob('operator-*')))}.log",
                            "--resync-period", "300", "--namespace", namespace, *flags)


def accepted(cluster: Cluster, namespace: str, name: str, status: str) -> dict[str, Any]:
    return wait_for(f"{name} Accepted={status}", lambda: (
        c if (c := fleet.conditions(cluster, namespace, name).get("Accepted")) and c["status"] == status else None),
        timeout=60)


def made(cluster: Cluster, namespace: str) -> list[str]:
    """Everything of a pool's kinds in the namespace (the default ServiceAccount is the namespace's)."""
    found = cluster.get("pods,services,deployments,serviceaccounts,roles,secrets,networkpolicies", "-n", namespace)
    return [f"{o['kind']}/{o['metadata']['name']}" for o in found["items"]
            if o["metadata"]["name"] != "default" and not o["metadata"]["name"].startswith("kube-root-ca")]


def test_hostile_pools_are_refused_at_admission_naming_field_and_policy_and_admitted_when_it_allows_them(
        cluster: Cluster, chart: None, namespace: str, admission: Any) -> None:
    strict_says = f"the pool policy's imagePrefixes ({FLEET_REPOSITORY};"
    admission(STRICT, "strict", manifest(namespace, "miner"), strict_says)
    for name, (_, field) in HOSTILE.items():
        refused = cluster.kubectl("create", "-f", "-", input=json.dumps(manifest(namespace, name)), check=False)
        assert refused.returncode != 0, f"{name} was admitted"
        assert f"{field}: " in refused.stderr and "the pool policy's" in refused.stderr, refused.stderr
        assert "chart value poolPolicy." in refused.stderr, refused.stderr
    assert cluster.get("inferencepools", "-n", namespace)["items"] == []
    assert made(cluster, namespace) == []

    # A custom logit processor runs code any client sends: refused for every pool, whatever the policy.
    logits = fleet.pool_manifest(namespace, "logits", engine={"extraArgs": ["--enable-custom-logit-processor"]})
    refused = cluster.kubectl("create", "-f", "-", input=json.dumps(logits), check=False)
    assert refused.returncode != 0 and "spec.engine.extraArgs[0]" in refused.stderr, refused.stderr

    sentinel = fleet.pool_manifest(namespace, "sentinel", router={"replicas": 0}, prefill={"replicas": 1},
                                   decode={"replicas": 1})
    scheduling_of("decode", priorityClassName="another")(sentinel["spec"])
    admission(ALLOWING, "allowing", sentinel, "the pool policy's priorityClasses (system-node-critical;")
    for name in HOSTILE:
        cluster.kubectl("create", "-f", "-", input=json.dumps(manifest(namespace, name, paused=True)))
    assert sorted(p["metadata"]["name"] for p in cluster.get("inferencepools", "-n", namespace)["items"]) == \
        sorted(HOSTILE)


def test_pools_admitted_before_the_policy_tightened_are_refused_on_reconcile_and_run_once_allowed(
        cluster: Cluster, chart: None, namespace: str, tmp_path: Path) -> None:
    # No admission policy binds this namespace: the pools are admitted, as on a cluster without one.
    for name in HOSTILE:
        cluster.kubectl("create", "-f", "-", input=json.dumps(manifest(namespace, name)))

    strict = [f"--allow-image-prefix={FLEET_REPOSITORY}", "--require-non-root-engines"]
    with operator_with(cluster, namespace, tmp_path, *strict) as op:
        for name, (_, field) in HOSTILE.items():
            cond = accepted(cluster, namespace, name, "False")
            assert cond["reason"] == "ForbiddenByPolicy" and cond["message"].startswith(field), cond
            assert "operator flag --" in cond["message"], cond["message"]
        wait_for("a reconcile of every pool", lambda: op.metric("pdfleet_reconcile_total") >= 2 * len(HOSTILE),
                 timeout=60)
        assert made(cluster, namespace) == [], "a refused pool makes nothing"
        for name in HOSTILE:
            said = [(e["type"], e.get("count", 1)) for e in fleet.events(cluster, namespace, name, "PolicyRefused")]
            assert said == [("Warning", 1)], (name, said)
        assert "Traceback" not in op.logs(), op.logs()[-3000:]

    # The admin allows them; one runs (its engines are made), the rest are paused.
    for name in [n for n in HOSTILE if n != "containerd"]:
        cluster.kubectl("patch", "pdpool", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"paused":true}}')
    allowing = ["--allow-host-path-prefix=/", "--allow-priority-class=system-node-critical",
                "--allow-toleration-key=*", f"--allow-image-prefix={FLEET_REPOSITORY}",
                "--allow-image-prefix=evil.example/"]
    with operator_with(cluster, namespace, tmp_path, *allowing) as op:
        for name in HOSTILE:
            assert accepted(cluster, namespace, name, "True")["reason"] == "Valid"
        pods = wait_for("the allowed pool's engine pods", lambda: (
            p if len(p := fleet.engine_pods(cluster, namespace, "containerd")) == 2 else None), timeout=60)
        volumes = [v for p in pods for v in p["spec"]["volumes"] if "hostPath" in v]
        assert [v["hostPath"]["path"] for v in volumes] == ["/run/containerd"] * 2
        assert "Traceback" not in op.logs(), op.logs()[-3000:]
