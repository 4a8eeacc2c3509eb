"""A second, private local control plane (own directory, own ports) for tests that must not disturb the cluster
the rest of the suite shares: its lifecycle, and what the operator does against an API that lacks its CRDs.
Brought up and down with hack/localcluster.py, as `make cluster-up` does the shared one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.ports import outside_ephemeral

ROOT = Path(__file__).resolve().parents[2]
# Apart from the shared cluster's defaults, and below the ephemeral range.
PORTS = {
    "PDFLEET_ETCD_PORT": "24790", "PDFLEET_ETCD_PEER_PORT": "24800", "PDFLEET_APISERVER_PORT": "26443",
    "PDFLEET_CONTROLLER_MANAGER_PORT": "24257", "PDFLEET_SCHEDULER_PORT": "24259", "PDFLEET_KWOK_PORT": "24247",
    "PDFLEET_SIM_PORT": "24248", "PDFLEET_KUEUE_WEBHOOK_PORT": "24251", "PDFLEET_KUEUE_HEALTH_PORT": "24252",
}
COMPONENTS = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "pdfleet-sim", "kueue"}


def environment(cluster_dir: Path) -> dict[str, str]:
    """The environment hack/localcluster.py reads to act on the private cluster in `cluster_dir`."""
    env = os.environ | outside_ephemeral(PORTS) | {
        "PDFLEET_CLUSTER_DIR": str(cluster_dir), "PDFLEET_GPU_NODES": "1", "PDFLEET_CPU_NODES": "0",
        # One real node per machine: its network namespace and ports are the shared cluster's.
        "PDFLEET_REAL_NODE": "0"}
    env.pop("PDFLEET_KUBECONFIG", None)
    return env


def localcluster(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "hack" / "localcluster.py"), *args], env=env, text=True,
                          capture_output=True, timeout=300)
