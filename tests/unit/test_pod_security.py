"""The securityContexts of the pods the operator renders (operator/render/pod_security.py): the router meets Pod
Security's `restricted`, engines `baseline` with what `restricted` asks that their function allows, IPC_LOCK only
with RDMA. tests/integration/test_pod_security_e2e.py puts the same pods to the real apiserver's admission."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.operator.api.roles import Role
from tests.unit.test_render import pods, spec_of
from tests.unit.test_render_effects import router_pod

RUNTIME_DEFAULT = {"type": "RuntimeDefault"}
NO_ESCALATION_NO_CAPABILITIES = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


@pytest.mark.parametrize("role", list(Role))
def test_engine_pods_have_the_runtime_default_seccomp_profile_no_escalation_and_no_capabilities(role: Role) -> None:
    for pod in pods(spec_of(), role):
        spec = pod["spec"]
        assert spec["securityContext"] == {"seccompProfile": RUNTIME_DEFAULT}
        init, engine = containers(spec)
        assert init["securityContext"] == {**NO_ESCALATION_NO_CAPABILITIES, "readOnlyRootFilesystem": True}
        assert engine["securityContext"] == NO_ESCALATION_NO_CAPABILITIES
        assert not any("privileged" in c["securityContext"] for c in containers(spec))
        assert "hostNetwork" not in spec and "hostPID" not in spec and "hostIPC" not in spec


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_only_an_rdma_engine_keeps_ipc_lock_and_only_in_its_engine_container(backend: str) -> None:
    pod = pods(spec_of(transfer={"backend": backend, "ibDevice": "mlx5_0"}), Role.DECODE)[0]
    init, engine = containers(pod["spec"])
    assert engine["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    without_device = pods(spec_of(transfer={"backend": backend}), Role.DECODE)[0]
    assert containers(without_device["spec"])[1]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_router_pod_runs_as_non_root_with_everything_restricted_asks() -> None:
    spec = router_pod(spec_of())
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                       "seccompProfile": RUNTIME_DEFAULT}
    (router,) = spec["containers"]
    assert router["securityContext"] == {**NO_ESCALATION_NO_CAPABILITIES, "readOnlyRootFilesystem": True}
    # Its only volume is a writable /tmp, an emptyDir (which restricted allows): Python's tempfile needs one, and
    # without it the router exited at import in a real container (tests/integration/test_real_node_chart.py).
    assert spec["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert router["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]


@pytest.mark.effect("spec.engine.runAsUser", "spec.engine.runAsGroup")
@pytest.mark.parametrize("role", list(Role))
def test_an_engine_given_a_user_runs_as_it_and_never_as_root(role: Role) -> None:
    for pod in pods(spec_of(engine__runAsUser=1000, engine__runAsGroup=2000), role):
        assert pod["spec"]["securityContext"] == {"seccompProfile": RUNTIME_DEFAULT, "runAsNonRoot": True,
                                                  "runAsUser": 1000, "runAsGroup": 2000}
    for pod in pods(spec_of(engine__runAsUser=1000), role):
        assert pod["spec"]["securityContext"] == {"seccompProfile": RUNTIME_DEFAULT, "runAsNonRoot": True,
                                                  "runAsUser": 1000}
