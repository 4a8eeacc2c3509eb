"""`make demo`'s script runs end to end: the chart, the operator under the chart's ServiceAccount, an example
pool going Ready, its pods on fake GPU nodes and the operator's events."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.cluster import Cluster

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]


def stop_demo_operator(pid_file: Path) -> None:
    """Signals the demo's operator, and only it: a stale pid may belong to another process by now."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text())
        if b"pdfleet.operator" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGTERM)


def test_the_demo_shows_a_pool_going_ready_with_its_events(cluster: Cluster) -> None:
    if not cluster.is_local:
        pytest.skip("the demo drives the local control plane")
    namespace = f"demo-{uuid.uuid4().hex[:8]}"
    pid_file = cluster.kubeconfig.parent / "demo" / "operator.pid"
    try:
        result = subprocess.run(["bash", str(ROOT / "hack" / "demo.sh")], cwd=ROOT, capture_output=True, text=True,
                                env=cluster.env | {"DEMO_NAMESPACE": namespace}, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        out = result.stdout
        assert "The pool is Ready" in out
        assert "GroupCreated" in out and "PoolReady" in out
        assert "127.1." in out, "pods show their loopback IPs"
    finally:
        stop_demo_operator(pid_file)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)
