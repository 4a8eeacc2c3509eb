"""The operator against a real apiserver that does not serve its kinds (a private control plane without pdfleet's
CRDs: what kopf's discovery concludes from a restarting apiserver, or from a chart installed without CRDs). kopf
watches none of them; the operator says so: not ready at once, naming the kinds, and not alive once the watch
deadline has passed, so that kubelet would restart it. The CRDs applied, kopf watches them (it rescans on a CRD
event) and the operator is ready and alive again (operator/kopf_watch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.private_cluster import localcluster

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 10


def test_an_operator_whose_kinds_the_api_does_not_serve_is_not_ready_then_not_alive_until_they_are_served(
        private_cluster: tuple[Path, dict[str, str]], cluster: Cluster, tmp_path: Path) -> None:
    cluster_dir, env = private_cluster
    up = localcluster(env, "up")
    assert up.returncode == 0, up.stderr
    private = Cluster(kubeconfig=cluster_dir / "kubeconfig", bin_dir=cluster.bin_dir)
    assert private.kubectl("get", "crd", "inferencepools.pdfleet.dev", check=False).returncode != 0
    op = OperatorProcess(private.kubeconfig, tmp_path / "operator.log", "--watch-deadline", f"{DEADLINE_S}s")
    try:
        ready = wait_for("/readyz to name the kinds kopf does not watch",
                         lambda: (a := op.probe("/readyz"))[0] == 503 and "inferencepools.pdfleet.dev" in a[1] and a,
                         timeout=60)
        named = ready[1].split("does not watch ", 1)[1].split(" (", 1)[0]
        assert set(named.split(", ")) == {"inferencepoolroles.pdfleet.dev", "inferencepools.pdfleet.dev"}, ready
        assert op.probe("/healthz")[0] == 200, "alive until the deadline"
        dead = wait_for("/healthz to fail once the deadline has passed",
                        lambda: (a := op.probe("/healthz"))[0] == 503 and a, timeout=DEADLINE_S + 60)
        assert "inferencepools.pdfleet.dev" in dead[1] and "a restart does" in dead[1]

        private.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        wait_for("/readyz ok once kopf watches the kinds", lambda: op.probe("/readyz") == (200, "ok"), timeout=60)
        assert op.probe("/healthz") == (200, "ok")
        said = [r["message"] for r in op.log_records() if r.get("logger") == "pdfleet.operator.kopf_watch"]
        assert len(said) == 1 and said[0].startswith("not alive: kopf does not watch"), said
        assert "Traceback" not in op.logs()
    finally:
        op.stop()
