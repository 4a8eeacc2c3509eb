"""The autoscaling examples target what the API has: an InferencePoolRole named `<pool>-<role>` of a pool in
examples/, through its scale subresource, with bounds the pool accepts (no 0 on a running pool). The HPA example is
also run by the real HPA controller (tests/integration/test_role_scale_e2e.py); KEDA is not part of the local
cluster, so its example is checked here only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pdfleet.operator.api import meta, role_scale
from pdfleet.operator.api.crd import role_crd
from pdfleet.operator.api.roles import Role

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCALERS = sorted((EXAMPLES / "autoscaling").glob("*.yaml"))
POOLS = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in EXAMPLES.glob("*.yaml")}


def _bounds(body: dict) -> tuple[int, int]:
    spec = body["spec"]
    if body["kind"] == "HorizontalPodAutoscaler":
        return spec.get("minReplicas", 1), spec["maxReplicas"]
    return spec.get("minReplicaCount", 0), spec["maxReplicaCount"]


def test_there_is_an_hpa_and_a_keda_example() -> None:
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in SCALERS}
    assert kinds == {"HorizontalPodAutoscaler", "ScaledObject"}


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
