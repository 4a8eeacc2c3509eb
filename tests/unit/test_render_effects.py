"""What each spec field changes in the rendered engine pods and router objects (see test_api_field_effects)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from pdfleet.operator.api.roles import DEFAULT_DRAIN_SECONDS, Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.render import desired
from pdfleet.runtime import drain
from tests.unit.test_render import CTX, pods, spec_of

Body = dict[str, Any]
ROLES = pytest.mark.parametrize("role", list(Role))


def engine(pod: Body) -> Body:
    return pod["spec"]["containers"][0]


def sglang_args(pod: Body) -> list[str]:
    args = engine(pod)["args"]
    return args[args.index("--") + 1:]


def value_of(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def router(spec: InferencePoolSpec) -> dict[str, Body]:
    return {o["kind"]: o for o in desired.desired(CTX, spec).router}


def router_pod(spec: InferencePoolSpec) -> Body:
    return router(spec)["Deployment"]["spec"]["template"]["spec"]


def role_update(role: Role, **fields: Any) -> dict[str, Any]:
    """pool_body updates setting `fields` of one role's section."""
    return {f"{role}__{name}": value for name, value in fields.items()}


# ---- model ------------------------------------------------------------------------------------------------

@pytest.mark.effect("spec.model.source.pvc.claimName", "spec.model.source.pvc.subPath")
def test_a_pvc_model_is_mounted_read_only_and_served_from_its_sub_path() -> None:
    spec = spec_of(model__source={"pvc": {"claimName": "weights", "subPath": "qwen/0.5b"}})
    for role in Role:
        pod = pods(spec, role)[0]
        assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in \
            pod["spec"]["volumes"]
        assert {"name": "model", "mountPath": "/models", "readOnly": True} in engine(pod)["volumeMounts"]
        assert value_of(sglang_args(pod), "--model-path") == "/models/qwen/0.5b"
    whole = pods(spec_of(model__source={"pvc": {"claimName": "weights"}}), Role.DECODE)[0]
    assert value_of(sglang_args(whole), "--model-path") == "/models"


@pytest.mark.effect("spec.model.source.hostPath.path")
def test_a_host_path_model_mounts_the_nodes_folder() -> None:
    pod = pods(spec_of(model__source={"hostPath": {"path": "/mnt/nvme/qwen"}}), Role.PREFILL)[0]
    assert {"name": "model", "hostPath": {"path": "/mnt/nvme/qwen", "type": "Directory"}} in pod["spec"]["volumes"]
    assert value_of(sglang_args(pod), "--model-path") == "/models"


# ---- engine -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["Always", "IfNotPresent", "Never"])
@pytest.mark.effect("spec.engine.imagePullPolicy")
def test_the_pull_policy_applies_to_every_engine_and_the_router(policy: str) -> None:
    spec = spec_of(engine__imagePullPolicy=policy)
    assert {engine(p)["imagePullPolicy"] for role in Role for p in pods(spec, role)} == {policy}
    assert router_pod(spec)["containers"][0]["imagePullPolicy"] == policy


def test_the_default_pull_policy_is_if_not_present() -> None:
    assert engine(pods(spec_of(), Role.DECODE)[0])["imagePullPolicy"] == "IfNotPresent"


@pytest.mark.effect("spec.engine.env.name", "spec.engine.env.value")
def test_env_reaches_every_engine_container_after_pdfleets_own() -> None:
    spec = spec_of(engine__env=[{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "EMPTY"}])
    for role in Role:
        env = engine(pods(spec, role)[0])["env"]
        assert env[-2:] == [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "EMPTY", "value": ""}]
        assert env[0]["name"] == "PYTHONPATH"


# ---- roles ------------------------------------------------------------------------------------------------

@ROLES
@pytest.mark.effect("spec.*.replicas")
def test_replicas_is_the_number_of_engine_groups(role: Role) -> None:
    spec = spec_of(**role_update(role, replicas=3))
    groups = [g for g in desired.desired(CTX, spec).groups if g.id.role is role]
    assert [g.id.name("p") for g in groups] == [f"p-{role}-{i}" for i in range(3)]


@ROLES
@pytest.mark.effect("spec.*.tp", "spec.*.dp")
def test_dp_turns_on_dp_attention_inside_the_group(role: Role) -> None:
    argv = sglang_args(pods(spec_of(**role_update(role, tp=4, gpusPerNode=4, dp=2)), role)[0])
    assert (value_of(argv, "--tp-size"), value_of(argv, "--dp-size")) == ("4", "2")
    assert "--enable-dp-attention" in argv
    assert "--dp-size" not in sglang_args(pods(spec_of(**role_update(role, tp=4, gpusPerNode=4)), role)[0])


@ROLES
@pytest.mark.effect("spec.*.nodesPerGroup", "spec.*.gpusPerNode")
def test_a_group_has_one_pod_per_node_each_requesting_gpus_per_node(role: Role) -> None:
    group_pods = pods(spec_of(**role_update(role, tp=8, gpusPerNode=4, nodesPerGroup=2)), role)
    assert len(group_pods) == 2
    for rank, pod in enumerate(group_pods):
        resources = engine(pod)["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "4"
        argv = sglang_args(pod)
        assert (value_of(argv, "--nnodes"), value_of(argv, "--node-rank")) == ("2", str(rank))


@ROLES
@pytest.mark.effect("spec.*.port")
def test_the_port_is_the_engines_http_port(role: Role) -> None:
    # Behind a router both roles share one port; without one each may have its own.
    pod = pods(spec_of(router={"replicas": 0}, **role_update(role, port=31000)), role)[0]
    assert value_of(sglang_args(pod), "--port") == "31000"
    assert {"name": "http", "containerPort": 31000} in engine(pod)["ports"]


@pytest.mark.effect("spec.decode.port")
def test_the_router_discovers_engines_on_the_decode_port() -> None:
    spec = spec_of(prefill__port=31000, decode__port=31000)
    args = router_pod(spec)["containers"][0]["args"]
    assert value_of(args, "--service-discovery-port") == "31000"


@pytest.mark.effect("spec.prefill.bootstrapPort")
def test_the_bootstrap_port_is_passed_exposed_and_announced_to_the_router() -> None:
    pod = pods(spec_of(prefill__bootstrapPort=9100), Role.PREFILL)[0]
    assert value_of(sglang_args(pod), "--disaggregation-bootstrap-port") == "9100"
    assert {"name": "bootstrap", "containerPort": 9100} in engine(pod)["ports"]
    assert pod["metadata"]["annotations"]["sglang.ai/bootstrap-port"] == "9100"


@ROLES
@pytest.mark.effect("spec.*.resources.requests", "spec.*.resources.limits")
def test_resources_are_the_engine_containers_next_to_the_gpus(role: Role) -> None:
    spec = spec_of(**role_update(role, resources={"requests": {"cpu": 16, "memory": "256Gi"},
                                                   "limits": {"memory": "512Gi"}}))
    assert engine(pods(spec, role)[0])["resources"] == {
        "requests": {"cpu": 16, "memory": "256Gi", "nvidia.com/gpu": "1"},
        "limits": {"memory": "512Gi", "nvidia.com/gpu": "1"},
    }


AFFINITY = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"pdfleet.dev/pool": "tiny"}}}]}}
TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoExecute",
              "tolerationSeconds": 300}
SCHEDULING = {"nodeSelector": {"pool": "gpu-a"}, "tolerations": [TOLERATION], "affinity": AFFINITY,
              "priorityClassName": "inference-high"}


def assert_scheduled_by(pod_spec: Body) -> None:
    assert pod_spec["nodeSelector"] == {"pool": "gpu-a"}
    assert TOLERATION in pod_spec["tolerations"]
    assert pod_spec["affinity"] == AFFINITY
    assert pod_spec["priorityClassName"] == "inference-high"


@ROLES
@pytest.mark.effect("spec.*.scheduling.nodeSelector", "spec.*.scheduling.affinity",
                    "spec.*.scheduling.priorityClassName", "spec.*.scheduling.tolerations.key",
                    "spec.*.scheduling.tolerations.operator", "spec.*.scheduling.tolerations.value",
                    "spec.*.scheduling.tolerations.effect", "spec.*.scheduling.tolerations.tolerationSeconds")
def test_scheduling_places_the_roles_pods_and_only_them(role: Role) -> None:
    spec = spec_of(**role_update(role, scheduling=SCHEDULING))
    assert_scheduled_by(pods(spec, role)[0]["spec"])
    other = pods(spec, Role.DECODE if role is Role.PREFILL else Role.PREFILL)[0]["spec"]
    assert other["nodeSelector"] == {} and "affinity" not in other and "priorityClassName" not in other
    assert router_pod(spec).get("affinity") != AFFINITY and router_pod(spec)["tolerations"] == []


# ---- router -----------------------------------------------------------------------------------------------

@pytest.mark.effect("spec.router.scheduling.nodeSelector", "spec.router.scheduling.affinity",
                    "spec.router.scheduling.priorityClassName", "spec.router.scheduling.tolerations.key",
                    "spec.router.scheduling.tolerations.operator", "spec.router.scheduling.tolerations.value",
                    "spec.router.scheduling.tolerations.effect",
                    "spec.router.scheduling.tolerations.tolerationSeconds")
def test_router_scheduling_places_the_router_pods_and_not_the_engines() -> None:
    spec = spec_of(router={"scheduling": SCHEDULING})
    assert_scheduled_by(router_pod(spec))
    assert all(pods(spec, role)[0]["spec"]["nodeSelector"] == {} for role in Role)


@pytest.mark.effect("spec.router.replicas")
def test_router_replicas_is_the_deployments() -> None:
    assert router(spec_of(router={"replicas": 3}))["Deployment"]["spec"]["replicas"] == 3


@pytest.mark.effect("spec.router.replicas")
def test_routers_are_two_by_default_spread_across_nodes_and_kept_by_a_disruption_budget() -> None:
    objects = router(spec_of())
    assert objects["Deployment"]["spec"]["replicas"] == 2
    spread = objects["Deployment"]["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]
    budget = objects["PodDisruptionBudget"]["spec"]
    assert budget == {"maxUnavailable": 1, "selector": objects["Deployment"]["spec"]["selector"]}
    # One router: no budget (it would block every node drain) and nothing to spread; the user's affinity wins.
    one = router(spec_of(router={"replicas": 1}))
    assert "PodDisruptionBudget" not in one and "affinity" not in one["Deployment"]["spec"]["template"]["spec"]
    assert router_pod(spec_of(router={"scheduling": SCHEDULING}))["affinity"] == AFFINITY


@pytest.mark.effect("spec.router.image")
def test_the_router_runs_its_own_image_or_else_the_engines() -> None:
    assert router_pod(spec_of(router={"image": "lmsysorg/sglang-router:v0.2"}))["containers"][0]["image"] == \
        "lmsysorg/sglang-router:v0.2"
    spec = spec_of()
    assert router_pod(spec)["containers"][0]["image"] == spec.engine.image


@pytest.mark.effect("spec.router.port")
def test_the_router_port_is_its_listen_port_container_port_and_service_port() -> None:
    objs = router(spec_of(router={"port": 8080}))
    container = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert value_of(container["args"], "--port") == "8080"
    assert {"name": "http", "containerPort": 8080} in container["ports"]
    assert {"name": "http", "port": 8080, "targetPort": "http"} in objs["Service"]["spec"]["ports"]


@pytest.mark.effect("spec.router.prefillPolicy", "spec.router.decodePolicy")
def test_the_policies_are_the_routers_arguments() -> None:
    default = router_pod(spec_of())["containers"][0]["args"]
    assert (value_of(default, "--prefill-policy"), value_of(default, "--decode-policy")) == \
        ("cache_aware", "round_robin")
    args = router_pod(spec_of(router={"prefillPolicy": "power_of_two", "decodePolicy": "random"}))[
        "containers"][0]["args"]
    assert (value_of(args, "--prefill-policy"), value_of(args, "--decode-policy")) == ("power_of_two", "random")


# ---- transfer ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["mooncake", "nixl", "fake"])
@pytest.mark.effect("spec.transfer.backend")
def test_the_transfer_backend_is_every_engines(backend: str) -> None:
    spec = spec_of(transfer={"backend": backend})
    for role in Role:
        assert value_of(sglang_args(pods(spec, role)[0]), "--disaggregation-transfer-backend") == backend


@pytest.mark.effect("spec.transfer.ibDevice")
def test_an_rdma_device_is_passed_and_lets_the_engine_pin_memory() -> None:
    pod = pods(spec_of(transfer={"backend": "mooncake", "ibDevice": "mlx5_0,mlx5_1"}), Role.DECODE)[0]
    assert value_of(sglang_args(pod), "--disaggregation-ib-device") == "mlx5_0,mlx5_1"
    assert engine(pod)["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    plain = engine(pods(spec_of(), Role.DECODE)[0])
    assert "add" not in plain["securityContext"]["capabilities"]
    assert "--disaggregation-ib-device" not in sglang_args(pods(spec_of(), Role.DECODE)[0])


@ROLES
@pytest.mark.effect("spec.*.drainSeconds")
def test_the_drain_bounds_the_prestop_wait_and_the_grace_period_follows_it(role: Role) -> None:
    default = pods(spec_of(), role)[0]["spec"]
    assert default["terminationGracePeriodSeconds"] == 180
    assert default["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] == \
        ["python3", "-m", "pdfleet.runtime.drain"], "the default renders the pods engine pods always had"
    assert drain.DEFAULT_TIMEOUT_S == DEFAULT_DRAIN_SECONDS, "the drain's own default is the API's"
    long = pods(spec_of(**role_update(role, drainSeconds=900)), role)[0]["spec"]
    assert long["terminationGracePeriodSeconds"] == 930
    command = long["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command == ["python3", "-m", "pdfleet.runtime.drain", "--timeout=900"]
    none = pods(spec_of(**role_update(role, drainSeconds=0)), role)[0]["spec"]
    assert none["terminationGracePeriodSeconds"] == 30


def test_the_drain_reads_the_bound_the_rendered_command_gives_it(capsys: pytest.CaptureFixture[str]) -> None:
    command = pods(spec_of(decode__drainSeconds=900), Role.DECODE)[0]["spec"]["containers"][0]["lifecycle"][
        "preStop"]["exec"]["command"]
    with socket.socket() as s:  # a loopback port nothing listens on: the engine is already gone
        s.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert drain.main([*command[3:], "--url", gone]) == 0
    assert "(at most 900 s)" in capsys.readouterr().err


@pytest.mark.effect("spec.router.circuitBreaker.enabled")
def test_circuit_breakers_are_off_by_default_and_on_they_bring_a_readiness_that_sees_open_circuits() -> None:
    off = router_pod(spec_of())
    assert "--disable-circuit-breaker" in off["containers"][0]["args"]
    assert off["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}
    assert [c["name"] for c in off["containers"]] == ["router"] and "initContainers" not in off
    on = router_pod(spec_of(router={"circuitBreaker": {"enabled": True}}))
    router_args = on["containers"][0]["args"]
    assert "--disable-circuit-breaker" not in router_args
    sidecar = next(c for c in on["containers"] if c["name"] == "ready")
    # A probe's named port is its own container's: the sidecar carries the probe, and a pod is Ready only when
    # every container is.
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "ready"}
    assert {"name": "ready", "containerPort": 29001} in sidecar["ports"]
    assert sidecar["command"] == ["python3", "-m", "pdfleet.runtime.router_ready"]
    # It asks the router's worker API with the router's own key, taken from the same Secret reference.
    key_env = next(e for e in on["containers"][0]["env"] if e["name"] == "PDFLEET_ROUTER_ADMIN_KEY")
    assert key_env in sidecar["env"]
    assert [c["name"] for c in on["initContainers"]] == ["pdfleet-runtime"]


@pytest.mark.effect("spec.router.circuitBreaker.failureThreshold", "spec.router.circuitBreaker.window",
                    "spec.router.circuitBreaker.openFor")
def test_the_breaker_settings_are_the_routers_arguments_in_whole_seconds_rounded_up() -> None:
    args = router_pod(spec_of(router={"circuitBreaker": {
        "enabled": True, "failureThreshold": 4, "window": "1m", "openFor": "1500ms"}}))["containers"][0]["args"]
    assert value_of(args, "--cb-failure-threshold") == "4"
    assert value_of(args, "--cb-window-duration-secs") == "60"
    assert value_of(args, "--cb-timeout-duration-secs") == "2"
    defaults = router_pod(spec_of(router={"circuitBreaker": {"enabled": True}}))["containers"][0]["args"]
    assert (value_of(defaults, "--cb-failure-threshold"), value_of(defaults, "--cb-window-duration-secs"),
            value_of(defaults, "--cb-timeout-duration-secs")) == ("10", "30", "10")
