"""The operator against a real apiserver that does not serve its kinds (a private control plane without pdfleet's
CRDs: what kopf's discovery concludes from a restarting apiserver, or from a chart installed without CRDs). kopf
watches none of them; the operator says so: not ready at once, naming the kinds, and not alive once the watch
deadline has passed, so that kubelet would restart it. With the CRDs applied, kopf scans their group again, but
that scan can come before the API serves the kinds (one run here: 'not served' at the CRDs' last event, then
nothing more), so the operator is either ready or still asking for its restart; restarted, as kubelet would, it
is ready and alive (operator/kopf_watch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.private_cluster import localcluster

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 10


def test_an_operator_whose_kinds_the_api_does_not_serve_is_not_ready_then_not_alive_and_a_restart_heals_it(
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
        private.wait_established("inferencepools.pdfleet.dev", "inferencepoolroles.pdfleet.dev")
        alive, ready = op.probe("/healthz"), op.probe("/readyz")
        assert alive[0] == 503 or ready == (200, "ok"), (alive, ready)  # never unready yet alive past the deadline
        said = [r["message"] for r in op.log_records() if r.get("logger") == "pdfleet.operator.kopf_watch"]
        assert len(said) == 1 and said[0].startswith("not alive: kopf does not watch"), said
        assert "Traceback" not in op.logs()
    finally:
        op.stop()
    restarted = OperatorProcess(private.kubeconfig, tmp_path / "restarted.log", "--watch-deadline", f"{DEADLINE_S}s")
    try:
        restarted.wait_ready()
        assert restarted.probe("/readyz") == (200, "ok") and restarted.probe("/healthz") == (200, "ok")
        assert "Unresolved resources" not in restarted.logs()
    finally:
        restarted.stop()
