"""Rendering: the objects of a pool, from its spec, without a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.render import desired, labels, revision
from pdfleet.operator.render.context import RenderContext
from pdfleet.operator.render.engine_group import METRICS_PORT
from pdfleet.podrunner import probes
from tests.support.pools import pool_body

CTX = RenderContext(pool="p", namespace="ns", uid="u1")


def spec_of(base: str = "minimal", **updates: Any) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate(pool_body(base=base, **updates)["spec"])


def pods(spec: InferencePoolSpec, role: Role) -> list[dict]:
    return [p for g in desired.desired(CTX, spec).groups if g.id.role is role for p in g.pods]


@pytest.mark.effect("spec.decode.gpusPerNode", "spec.decode.scheduling.nodeSelector")
def test_an_engine_pod_requests_its_gpus_and_tolerates_gpu_nodes() -> None:
    pod = pods(spec_of(base="deepseek-v4-sm120"), Role.DECODE)[0]
    engine = pod["spec"]["containers"][0]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["spec"]["tolerations"])
    assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"].startswith("NVIDIA-RTX-PRO-6000")


def test_no_probe_ever_calls_sglangs_generating_health_endpoint() -> None:
    for role in Role:
        engine = pods(spec_of(), role)[0]["spec"]["containers"][0]
        probes = [engine[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")]
        paths = [p["httpGet"]["path"] for p in probes]
        assert not any(path.startswith(("/health", "/health_generate")) for path in paths), paths
        assert engine["readinessProbe"]["periodSeconds"] >= 10 and engine["livenessProbe"]["periodSeconds"] >= 10
        startup = engine["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600, "weights may take an hour to load"


def test_the_other_nodes_of_a_multi_node_group_are_probed_on_sglangs_placeholder_server() -> None:
    # SGLang serves its API on node rank 0 only; the others answer /health without generating anything.
    decode = pods(spec_of(base="multinode-decode"), Role.DECODE)
    leaders = [p for p in decode if p["metadata"]["labels"]["pdfleet.dev/node-rank"] == "0"]
    others = [p for p in decode if p["metadata"]["labels"]["pdfleet.dev/node-rank"] != "0"]
    assert leaders and others
    for pod in leaders:
        assert pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    for pod in others:
        engine = pod["spec"]["containers"][0]
        assert engine["startupProbe"]["httpGet"]["path"] == engine["readinessProbe"]["httpGet"]["path"] == "/health"
        assert engine["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "agent"}


@pytest.mark.effect("spec.engine.image", "spec.engine.patches")
def test_the_engine_starts_through_pdfleets_runtime_with_the_pools_patches() -> None:
    spec = spec_of(base="deepseek-v4-sm120")
    pod = pods(spec, Role.PREFILL)[0]
    init = pod["spec"]["initContainers"][0]
    engine = pod["spec"]["containers"][0]
    assert init["image"] == CTX.runtime_image
    assert engine["image"] == spec.engine.image
    assert engine["command"] == ["python3", "-m", "pdfleet.runtime.launcher"]
    sep = engine["args"].index("--")
    assert [a for a in engine["args"][:sep] if a.startswith("--patch=")] == [
        f"--patch={p}" for p in spec.engine.patches]
    assert "--disable-overlap-schedule" in engine["args"][sep:]
    # The metrics-only port: named `metrics` (what a PodMonitor selects), served by the launcher's relay.
    assert f"--metrics-port={METRICS_PORT}" in engine["args"][:sep]
    assert {"name": "metrics", "containerPort": METRICS_PORT} in engine["ports"]
    assert pod["metadata"]["annotations"][labels.PATCHES] == ",".join(spec.engine.patches)
    assert pod["metadata"]["annotations"][labels.IMAGE] == spec.engine.image
    for patch in spec.engine.patches:
        assert pod["metadata"]["labels"][f"patch.pdfleet.dev/{patch}"] == "true"
    assert len(pod["metadata"]["labels"]["pdfleet.dev/image-hash"]) == 16


def test_a_drain_runs_before_the_engine_stops_and_has_time_to_finish() -> None:
    pod = pods(spec_of(), Role.DECODE)[0]
    assert pod["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1] == "pdfleet.runtime.drain"
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 60
    assert pod["spec"]["restartPolicy"] == "Never", "the operator restarts a group as a unit, not kubelet"


@pytest.mark.effect("spec.decode.nodesPerGroup")
def test_multi_node_groups_meet_at_their_leader_through_the_roles_headless_service() -> None:
    spec = spec_of(base="multinode-decode")
    want = desired.desired(CTX, spec)
    group = next(g for g in want.groups if g.id.role is Role.DECODE)
    assert len(group.pods) == spec.decode.nodes_per_group > 1
    [service] = [s for s in want.services if s["metadata"]["name"] == "p-decode"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True, "ranks meet before any of them is Ready"
    for rank, pod in enumerate(group.pods):
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--node-rank") + 1] == str(rank)
        assert args[args.index("--dist-init-addr") + 1] == "p-decode-0-0.p-decode.ns.svc:5000"
        assert pod["spec"]["subdomain"] == "p-decode"
        assert pod["spec"]["hostname"] == f"p-decode-0-{rank}"
        # The Service selects every pod of the role, and so gives each its DNS name.
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


def test_one_headless_service_per_role_whatever_the_number_of_groups() -> None:
    names = sorted(s["metadata"]["name"] for s in desired.desired(CTX, spec_of(prefill=3, decode=5)).services)
    assert names == ["p-decode", "p-prefill"]


def test_the_router_discovers_engines_by_label_with_a_role_that_can_only_read_pods() -> None:
    objs = {o["kind"]: o for o in desired.desired(CTX, spec_of()).router}
    args = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--service-discovery" in args and "--pd-disaggregation" in args
    assert args[args.index("--prefill-selector") + 1:args.index("--decode-selector")] == [
        "app.kubernetes.io/managed-by=pdfleet", "pdfleet.dev/pool=p", "pdfleet.dev/role=prefill",
        "pdfleet.dev/node-rank=0"]
    assert objs["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert objs["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == "p-router"


def test_a_router_slow_to_start_is_not_killed_before_it_listens() -> None:
    """A busy node took 40+ s to start a router (its Python entry point, then the Rust server): with a liveness
    probe alone (3 x 20 s) kubelet killed it before it listened, and again at every restart. Under kubelet's rules
    (the pod runner's, podrunner/probes.py), two minutes of refused connections fail no probe that kills it; the
    startup probe asks what liveness asks, and often, so the router is judged soon after it listens."""
    deployment = next(o for o in desired.desired(CTX, spec_of()).router if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    specs = probes.parse(container)
    startup = probes.ProbeState(specs[probes.Kind.STARTUP])
    refused_for_s = 120
    assert not any(startup.observe(False) and startup.result is probes.Result.FAILURE
                   for _ in range(int(refused_for_s / startup.spec.period_s)))
    assert startup.spec.period_s * startup.spec.failure_threshold >= 240
    assert specs[probes.Kind.STARTUP].action == specs[probes.Kind.LIVENESS].action
    assert startup.spec.period_s <= 2
    assert startup.observe(True) and startup.result is probes.Result.SUCCESS


@pytest.mark.effect("spec.router.replicas")
def test_a_pool_without_a_router_renders_none() -> None:
    assert desired.desired(CTX, spec_of(router={"replicas": 0})).router == ()


@pytest.mark.parametrize(("change", "changes_revision"), [
    ({"decode__replicas": 5}, False),
    ({"router": {"replicas": 3}}, False),
    ({"engine__overlapSchedule": "Disabled"}, True),
    ({"engine__image": "lmsysorg/sglang:v0.5.23-cu130"}, True),
])
def test_only_changes_that_shape_an_engine_make_a_new_revision(change: dict, changes_revision: bool) -> None:
    before = revision.role_revision(spec_of(), Role.DECODE)
    after = revision.role_revision(spec_of(**change), Role.DECODE)
    assert (before != after) is changes_revision


def test_every_object_is_stamped_so_an_unchanged_one_is_never_rewritten() -> None:
    first = desired.desired(CTX, spec_of()).objects()
    again = desired.desired(CTX, spec_of()).objects()
    assert [o["metadata"]["annotations"][labels.APPLIED_HASH] for o in first] == [
        o["metadata"]["annotations"][labels.APPLIED_HASH] for o in again]
