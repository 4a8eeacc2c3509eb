"""A role as a scale target, on the real control plane: `kubectl scale` on an InferencePoolRole, a change to the
pool's replicas written back, a HorizontalPodAutoscaler run by the real kube-controller-manager moving a role
through the scale subresource, a scale the pool cannot take refused and said, and a role scaled down and up under
client load through the real router without a failed request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.test_cli_e2e import pdfleet
from tests.integration.test_rollout_under_load_e2e import client_load
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.pools import example

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
POOL = "scaled"
ROLE = f"{POOL}-decode"


def _pool(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return cluster.get("pdpool", POOL, "-n", namespace)


def _role(cluster: Cluster, namespace: str, role: str = "decode") -> dict[str, Any] | None:
    found = cluster.kubectl("get", "inferencepoolrole", f"{POOL}-{role}", "-n", namespace, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def _serving(cluster: Cluster, namespace: str, decode: int) -> dict[str, Any] | None:
    """The InferencePoolRole once the pool runs `decode` ready decode groups and the role says so."""
    pool, role = _pool(cluster, namespace), _role(cluster, namespace)
    status = pool.get("status") or {}
    if role is None or pool["spec"]["decode"]["replicas"] != decode or status.get("phase") != "Ready" \
            or status.get("decode", {}).get("ready") != decode:
        return None
    seen = role.get("status") or {}
    if (role["spec"]["replicas"], seen.get("replicas"), seen.get("readyReplicas")) != (decode, decode, decode):
        return None
    return role if seen.get("observedGeneration") == role["metadata"]["generation"] else None


@pytest.mark.effect("spec.decode.scaleTarget")
def test_a_role_scales_by_kubectl_and_by_the_real_hpa_through_its_inference_pool_role(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    cluster.wait_established("inferencepoolroles.pdfleet.dev")
    body = example("minimal")
    body["metadata"] = {"name": POOL, "namespace": namespace}
    body["spec"]["decode"]["scaleTarget"] = True
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))

    role = wait_for("the decode InferencePoolRole, in step with one ready group",
                    lambda: _serving(cluster, namespace, 1), timeout=120)
    assert role["status"]["selector"] == \
        f"app.kubernetes.io/managed-by=pdfleet,pdfleet.dev/pool={POOL},pdfleet.dev/role=decode"
    assert _role(cluster, namespace, "prefill") is None, "prefill is no scale target"
    table = cluster.kubectl("get", "pdrole", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "POOL", "ROLE", "DESIRED", "CURRENT", "READY", "AGE"]
    assert table[1].split()[:6] == [ROLE, POOL, "decode", "1", "1", "1"]

    # kubectl scale writes the scale subresource; the operator moves the pool, which grows a group.
    cluster.kubectl("scale", "inferencepoolrole", ROLE, "-n", namespace, "--replicas=2")
    wait_for("the pool at 2 decode groups after kubectl scale", lambda: _serving(cluster, namespace, 2), timeout=120)
    reasons = [e["reason"] for e in cluster.get("events", "-n", namespace, "--field-selector",
                                                "involvedObject.kind=InferencePool")["items"]]
    assert "RoleScaled" in reasons and "Scaled" in reasons
    assert operator.metric("pdfleet_role_scales_total", role="decode", result="taken") >= 1
    shown = pdfleet(cluster, "status", POOL, "-n", namespace)
    assert f"  scale target: InferencePoolRole {ROLE} asks 2 group(s)" in shown.stdout.splitlines(), shown.stdout

    # A person's edit of the pool's replicas is written back into the InferencePoolRole.
    cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge",
                    "-p", '{"spec": {"decode": {"replicas": 1}}}')
    wait_for("the InferencePoolRole back at 1 after the pool's edit", lambda: _serving(cluster, namespace, 1),
             timeout=120)

    # The real HPA controller reads the role's /scale and raises it to its minimum (no metrics needed for that).
    # The example HPA, its metric unserved here (no metrics adapter): the controller still applies its bounds.
    hpa = yaml.safe_load((ROOT / "examples" / "autoscaling" / "decode-hpa.yaml").read_text())
    hpa["metadata"] = {"name": ROLE, "namespace": namespace}
    hpa["spec"]["scaleTargetRef"]["name"] = ROLE
    assert hpa["spec"]["minReplicas"] == 2
    cluster.kubectl("apply", "-f", "-", input=json.dumps(hpa))
    try:
        wait_for("the HPA's minimum reached through the scale subresource", lambda: _serving(cluster, namespace, 2),
                 timeout=240)
    except AssertionError as e:
        raise AssertionError(f"{e}\nHPA: {cluster.get('hpa', ROLE, '-n', namespace).get('status')}\npool: "
                             f"{_pool(cluster, namespace).get('status')}\nrole: {_role(cluster, namespace)}") from None
    seen = cluster.get("hpa", ROLE, "-n", namespace).get("status") or {}
    assert seen.get("desiredReplicas") == 2, seen
    cluster.kubectl("delete", "hpa", ROLE, "-n", namespace)

    # KEDA can scale to zero; a running PD pool cannot run without a role: refused, said, nothing changed.
    cluster.kubectl("scale", "inferencepoolrole", ROLE, "-n", namespace, "--replicas=0")

    def refused() -> dict[str, Any] | None:
        role = _role(cluster, namespace)
        return role if role and "at least 1" in ((role.get("status") or {}).get("message") or "") else None

    wait_for("the refusal in the InferencePoolRole's status", refused, timeout=60)
    assert _pool(cluster, namespace)["spec"]["decode"]["replicas"] == 2
    warnings = [e for e in cluster.get("events", "-n", namespace, "--field-selector",
                                       "involvedObject.kind=InferencePool")["items"] if e["reason"] == "ScaleRefused"]
    assert warnings and warnings[0]["type"] == "Warning"
    assert operator.metric("pdfleet_role_scales_total", role="decode", result="refused") >= 1

    # No longer a scale target: the InferencePoolRole goes, the pool keeps its replicas.
    cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge",
                    "-p", '{"spec": {"decode": {"scaleTarget": false}}}')
    wait_for("the InferencePoolRole removed", lambda: _role(cluster, namespace) is None or None, timeout=60)
    assert _pool(cluster, namespace)["spec"]["decode"]["replicas"] == 2


LOADED = "scaledload"


def _settled(cluster: Cluster, namespace: str, decode: int, url: str, key: str) -> bool:
    """`decode` decode groups, every engine pod Ready, and the router sending to exactly those engines."""
    status = fleet.pool(cluster, namespace, LOADED).get("status") or {}
    pods = fleet.engine_pods(cluster, namespace, LOADED)
    if status.get("decode", {}).get("desired") != decode or len(pods) != 2 + decode \
            or not all(fleet.is_ready(p) for p in pods):
        return False
    port = fleet.pool(cluster, namespace, LOADED)["spec"]["decode"]["port"]
    engines = {f"http://{p['status']['podIP']}:{port}" for p in pods}
    return {w["url"] for w in fleet.workers(url, key) or []} == engines


def test_a_role_scaled_down_and_up_under_load_fails_no_request(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """The decode role of a 2+2 pool serving short and long requests (seconds each, so the group that goes holds
    some) through the real router is scaled to 1 and back to 2 through its InferencePoolRole."""
    fleet.apply_pool(cluster, namespace, LOADED, decode={"scaleTarget": True})
    fleet.wait_ready(cluster, namespace, LOADED, timeout=240)
    url = fleet.router_url(cluster, namespace, LOADED, workers=4)
    key = fleet.router_key(cluster, namespace, LOADED)
    role = f"{LOADED}-decode"
    with client_load(url) as (load, long):
        wait_for("the load flowing", lambda: load.tally.ok >= 40 and long.tally.ok >= 2, timeout=60)
        cluster.kubectl("scale", "inferencepoolrole", role, "-n", namespace, "--replicas=1")
        wait_for("one decode group left, and the router sending only to what is left",
                 lambda: _settled(cluster, namespace, 1, url, key), timeout=180, interval=0.5)
        after_down = load.tally.ok
        cluster.kubectl("scale", "inferencepoolrole", role, "-n", namespace, "--replicas=2")
        wait_for("two decode groups again, both in the router's rotation",
                 lambda: _settled(cluster, namespace, 2, url, key), timeout=180, interval=0.5)
        wait_for("requests served after the scale-up", lambda: load.tally.ok >= after_down + 40, timeout=60)
    summary = (load.tally.summary(), long.tally.summary(), fleet.event_lines(cluster, namespace))
    assert load.tally.failed == 0 and long.tally.failed == 0, summary
    assert load.tally.in_flight == long.tally.in_flight == 0, summary
    assert long.tally.ok >= 4, summary
    scaled = [e["message"] for e in fleet.events(cluster, namespace, LOADED, "Scaled")]
    assert any("decode from 2 to 1" in m for m in scaled) and any("decode from 1 to 2" in m for m in scaled), scaled
