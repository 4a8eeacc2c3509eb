"""`make demo`'s script runs end to end: the chart with its own operator Deployment (played by pdfleet-sim), a pool
going Ready on real readiness, requests through the real router, a desync detected, evidence captured, the
group restarted and the pool Ready again, with the client's count of failed requests; in its last act a pool
autoscaled on both roles grows under a load ramp and shrinks back."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from tests.support.release import RELEASE_NAMESPACE

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_serves_requests_through_a_desync_and_its_restart(cluster: Cluster) -> None:
    if not cluster.is_local:
        pytest.skip("the demo drives the local control plane")
    namespace = f"demo-{uuid.uuid4().hex[:8]}"
    try:
        # Its own session, so that everything it started (its client load, say) goes with it whatever happens.
        demo = subprocess.Popen(["bash", str(ROOT / "hack" / "demo.sh")], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=cluster.env | {"DEMO_NAMESPACE": namespace},
                                start_new_session=True)
        try:
            out, err = demo.communicate(timeout=780)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGKILL)
        assert demo.returncode == 0, out[-4000:] + err[-3000:]
        assert "PoolReady" in out and "127.1." in out, "pods show their loopback IPs"
        for reason in ("GroupDesync", "EvidenceCaptured", "GroupRestarted", "RouterWorkerRemoved",
                       "RolloutCanaryBaking", "RolloutAnalysisFailed", "RolloutRolledBack"):
            assert reason in out, reason
        assert "verdict: Desync" in out, "the evidence summary is shown"
        # Act four: the autoscaled pool grew under the ramp and shrank back, its decisions shown as Events.
        assert "ScaledUp " in out and "ScaledDown " in out and "client requests failed over the ramp" in out
        final = re.findall(r"final: requests (\d+)  ok (\d+)  failed (\d+)", out)
        assert final, out[-2000:]
        sent, ok, failed = map(int, final[-1])
        print(f"demo: {sent} requests, {ok} ok, {failed} failed")
        assert ok >= 200 and ok + failed <= sent
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)
        # The demo's own release runs an operator for the demo's namespace only.
        cluster.helm("uninstall", "pdfleet-demo", "--namespace", RELEASE_NAMESPACE, check=False)
