"""The pods pdfleet makes, put to the real apiserver's Pod Security admission (docs/security.md).

In a namespace that enforces a level (`pod-security.kubernetes.io/enforce`), a server-side dry run creates each
pod as it would be created: the operator's pod from the chart's Deployment (rendered by the real helm), the
router's pod from the router Deployment the operator renders, and engine pods as the operator renders them. The
operator's and the router's pods are admitted under `restricted`, engine pods under `baseline`; the same pods
without their securityContext are refused, so these checks can fail. What takes an engine pod out of
`baseline` (RDMA's IPC_LOCK, a hostPath model) is refused there, as docs/security.md says."""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.render import desired
from pdfleet.operator.render.context import RenderContext
from tests.support.cluster import Cluster
from tests.support.pools import pool_body
from tests.unit import test_chart

pytestmark = pytest.mark.cluster

Body = dict[str, Any]


@contextlib.contextmanager
def enforcing(cluster: Cluster, level: str) -> Iterator[str]:
    """A fresh namespace whose Pod Security admission enforces `level`, deleted afterwards."""
    name = f"t-psa-{level}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    try:
        cluster.kubectl("label", "namespace", name, "pdfleet.dev/test=true",
                        f"pod-security.kubernetes.io/enforce={level}",
                        "pod-security.kubernetes.io/enforce-version=latest")
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def as_pod(name: str, namespace: str, spec: Body) -> Body:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": copy.deepcopy(spec)}


def dry_run(cluster: Cluster, pod: Body) -> str | None:
    """None if the apiserver admits the pod (server-side dry run), else its refusal."""
    # The ServiceAccount admission refuses a pod whose account does not exist yet (a new namespace's `default`
    # comes from a controller, a moment after the namespace): created here if missing (AlreadyExists is fine).
    account = pod["spec"].get("serviceAccountName") or "default"
    cluster.kubectl("create", "serviceaccount", account, "-n", pod["metadata"]["namespace"], check=False)
    proc = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    return None if proc.returncode == 0 else proc.stderr


def without_security_contexts(pod: Body) -> Body:
    pod = copy.deepcopy(pod)
    pod["spec"].pop("securityContext", None)
    for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        container.pop("securityContext", None)
    return pod


def operator_pod(namespace: str) -> Body:
    deployment = test_chart.one(test_chart.render("default"), "Deployment")
    return as_pod("pdfleet-operator", namespace, deployment["spec"]["template"]["spec"])


def pool_objects(namespace: str, **updates: Any) -> desired.Desired:
    body = pool_body(namespace=namespace, **updates)
    return desired.desired(RenderContext.of(body), InferencePoolSpec.model_validate(body["spec"]))


def router_pod(namespace: str) -> Body:
    (deployment,) = [o for o in pool_objects(namespace).router if o["kind"] == "Deployment"]
    return as_pod("router", namespace, deployment["spec"]["template"]["spec"])


def engine_pod(namespace: str, **updates: Any) -> Body:
    group = next(g for g in pool_objects(namespace, **updates).groups if g.id.role is Role.DECODE)
    pod = copy.deepcopy(group.pods[0])
    pod["metadata"] = {"name": pod["metadata"]["name"], "namespace": namespace}  # no owner: a dry run of it alone
    return pod


def violates(level: str, refusal: str | None, *fields: str) -> None:
    assert refusal is not None, "admitted"
    assert f'violates PodSecurity "{level}:latest"' in refusal, refusal
    for field in fields:
        assert field in refusal, refusal


@pytest.mark.parametrize("render", [operator_pod, router_pod], ids=["operator (chart)", "router (operator)"])
def test_the_operator_and_router_pods_are_admitted_under_restricted(cluster: Cluster,
                                                                   render: Callable[[str], Body]) -> None:
    with enforcing(cluster, "restricted") as namespace:
        pod = render(namespace)
        assert dry_run(cluster, pod) is None
        violates("restricted", dry_run(cluster, without_security_contexts(pod)),
                 "allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true",
                 "seccompProfile")


def test_engine_pods_are_admitted_under_baseline_and_not_restricted_for_running_as_root(cluster: Cluster) -> None:
    with enforcing(cluster, "baseline") as namespace:
        assert dry_run(cluster, engine_pod(namespace)) is None
    with enforcing(cluster, "restricted") as namespace:
        refusal = dry_run(cluster, engine_pod(namespace))
        # Only what SGLang's images need: their root user. Every other restricted rule is met.
        violates("restricted", refusal, "runAsNonRoot != true")
        assert "allowPrivilegeEscalation" not in refusal and "unrestricted capabilities" not in refusal
        assert "seccompProfile" not in refusal
        violates("restricted", dry_run(cluster, without_security_contexts(engine_pod(namespace))),
                 "allowPrivilegeEscalation != false", "unrestricted capabilities", "seccompProfile")


def test_an_engine_pod_given_a_user_of_its_own_is_admitted_under_restricted(cluster: Cluster) -> None:
    with enforcing(cluster, "restricted") as namespace:
        assert dry_run(cluster, engine_pod(namespace, engine__runAsUser=1000)) is None


def test_what_takes_an_engine_pod_out_of_baseline_is_refused_there(cluster: Cluster) -> None:
    """RDMA's IPC_LOCK and a hostPath model: a pool asking for either needs a namespace admitting privileged."""
    with enforcing(cluster, "baseline") as namespace:
        rdma = engine_pod(namespace, transfer={"backend": "mooncake", "ibDevice": "mlx5_0"})
        violates("baseline", dry_run(cluster, rdma), "non-default capabilities", "IPC_LOCK")
        host_path = engine_pod(namespace, model__source={"hostPath": {"path": "/models/m"}})
        violates("baseline", dry_run(cluster, host_path), "hostPath volumes")
