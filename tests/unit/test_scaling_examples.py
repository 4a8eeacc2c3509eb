"""The autoscaling examples target what the API has: an InferencePoolRole named `<pool>-<role>` of a pool in
examples/, through its scale subresource, with bounds the pool accepts (no 0 on a running pool). The HPA example is
also run by the real HPA controller (tests/integration/test_role_scale_e2e.py); KEDA is not part of the local
cluster, so its example is checked here only. So is the PodMonitor that feeds both: it selects the pool's engine
pods on a port they have, and the metricsFrom its comment applies admits that Prometheus there and nowhere else."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet.operator.api import meta, role_scale
from pdfleet.operator.api.crd import role_crd
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.render import desired, labels
from pdfleet.operator.render.context import RenderContext
from pdfleet.operator.render.desired import Desired
from pdfleet.operator.render.engine_group import AGENT_PORT
from pdfleet.runtime import metrics_relay
from tests.unit.test_network_policy import CTX, Peer, admits

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCALER_KINDS = {"HorizontalPodAutoscaler", "ScaledObject"}
SCALERS = sorted(p for p in (EXAMPLES / "autoscaling").glob("*.yaml")
                 if yaml.safe_load(p.read_text())["kind"] in SCALER_KINDS)
POD_MONITOR = EXAMPLES / "autoscaling" / "engine-podmonitor.yaml"
POOLS = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in EXAMPLES.glob("*.yaml")}


def _bounds(body: dict) -> tuple[int, int]:
    spec = body["spec"]
    if body["kind"] == "HorizontalPodAutoscaler":
        return spec.get("minReplicas", 1), spec["maxReplicas"]
    return spec.get("minReplicaCount", 0), spec["maxReplicaCount"]


def test_there_is_an_hpa_and_a_keda_example() -> None:
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in SCALERS}
    assert kinds == SCALER_KINDS
    others = {p.name for p in (EXAMPLES / "autoscaling").glob("*.yaml")} - {p.name for p in SCALERS}
    assert others == {POD_MONITOR.name}, "a new kind of example needs its own check here"


@pytest.mark.parametrize("path", SCALERS, ids=lambda p: p.name)
def test_an_example_scales_an_inference_pool_role_of_an_example_pool_within_what_the_pool_takes(path: Path) -> None:
    body = yaml.safe_load(path.read_text())
    target = body["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == (meta.API_VERSION, role_scale.KIND)
    pool, _, role = target["name"].rpartition("-")
    assert pool in POOLS and role in set(Role), target["name"]
    assert target["name"] == role_scale.object_name(pool, Role(role))
    low, high = _bounds(body)
    assert 1 <= low <= high <= 1024, "a running pool refuses 0 groups of a role; the API's maximum is 1024"
    assert "scale" in role_crd()["spec"]["versions"][0]["subresources"]


def _selects(selector: dict[str, Any], found: dict[str, str]) -> bool:
    exists = [e["key"] for e in selector.get("matchExpressions") or [] if e["operator"] == "Exists"]
    assert len(exists) == len(selector.get("matchExpressions") or []), "only Exists is evaluated here"
    return all(found.get(k) == v for k, v in selector["matchLabels"].items()) and all(k in found for k in exists)


def _example_pool(spec_patch: dict[str, Any] | None = None) -> tuple[RenderContext, Desired]:
    """examples/minimal.yaml's pool, `spec_patch` merged into its spec at the top level, rendered."""
    pool = yaml.safe_load((EXAMPLES / "minimal.yaml").read_text())
    ctx = dataclasses.replace(CTX, pool=pool["metadata"]["name"])
    return ctx, desired.desired(ctx, InferencePoolSpec.model_validate({**pool["spec"], **(spec_patch or {})}))


def test_the_pod_monitor_scrapes_the_metrics_port_of_every_engine_of_the_pool_and_nothing_else() -> None:
    monitor = yaml.safe_load(POD_MONITOR.read_text())
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    ctx, want = _example_pool()
    assert monitor["metadata"]["name"].startswith(ctx.pool + "-")
    engines = [pod for group in want.groups for pod in group.pods]
    assert engines and all(_selects(monitor["spec"]["selector"], pod["metadata"]["labels"]) for pod in engines)
    for pod in engines:
        ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
        assert ports["metrics"] == metrics_relay.DEFAULT_PORT
    [router] = [b for b in want.router if b["kind"] == "Deployment"]
    assert not _selects(monitor["spec"]["selector"], router["spec"]["template"]["metadata"]["labels"])


def test_the_metrics_from_in_the_pod_monitors_comment_admits_that_prometheus_to_the_metrics_port_only() -> None:
    [command] = [line for line in POD_MONITOR.read_text().splitlines() if "kubectl patch pdpool" in line]
    patch = json.loads(command.split(" -p ", 1)[1].strip().strip("'"))
    ctx, want = _example_pool(patch["spec"])
    engine = {**labels.common(ctx.pool, "decode-engine"), labels.ROLE: "decode"}
    prometheus = Peer("monitoring", {"app.kubernetes.io/name": "prometheus"})
    rendered = list(want.policies)
    assert admits(rendered, engine, prometheus, metrics_relay.DEFAULT_PORT)
    others = {p["containerPort"] for g in want.groups for pod in g.pods
              for p in pod["spec"]["containers"][0]["ports"] if p["name"] != "metrics"}
    assert AGENT_PORT in others
    for port in others:
        assert not admits(rendered, engine, prometheus, port), port
    _, unpatched = _example_pool()
    assert not admits(list(unpatched.policies), engine, prometheus, metrics_relay.DEFAULT_PORT), \
        "the patch is needed: by default the port admits the pool's namespace only"
