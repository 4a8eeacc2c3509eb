"""`cluster-up` is idempotent and `cluster-down` leaves nothing running.

These start a second, private control plane (own directory, own ports), so they never disturb the cluster
the rest of the suite shares.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.private_cluster import COMPONENTS, localcluster

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("PDFLEET_CACHE", Path.home() / ".cache" / "pdfleet")) / "bin"
SIM_PYTHON = str(ROOT / ".venv" / "bin" / "python")


def processes_of(cluster_dir: Path) -> list[str]:
    """Command lines of live processes that belong to the cluster in `cluster_dir` (they name it in a flag)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        argv0 = cmdline.split(" ", 1)[0]
        ours = argv0.startswith(str(BIN)) or (argv0 == SIM_PYTHON and "pdfleet.podrunner" in cmdline)
        if str(cluster_dir) in cmdline and state not in ("Z", "X") and ours:
            found.append(cmdline)
    return found


def pids(cluster_dir: Path) -> dict[str, str]:
    return {p.stem: p.read_text().strip() for p in (cluster_dir / "run").glob("*.pid")}


def test_up_twice_is_harmless_and_down_leaves_no_process(private_cluster: tuple[Path, dict[str, str]]) -> None:
    cluster_dir, env = private_cluster
    first = localcluster(env, "up")
    assert first.returncode == 0, first.stderr
    assert "cluster is up" in first.stderr
    started = pids(cluster_dir)
    assert set(started) == COMPONENTS
    assert len(processes_of(cluster_dir)) == len(COMPONENTS)

    second = localcluster(env, "up")
    assert second.returncode == 0, second.stderr
    assert "cluster was already up" in second.stderr
    assert pids(cluster_dir) == started, "a second `up` must not restart anything"
    assert localcluster(env, "status").returncode == 0

    down = localcluster(env, "down")
    assert down.returncode == 0, down.stderr
    assert processes_of(cluster_dir) == []
    assert localcluster(env, "status").returncode == 1
    assert "nothing was running" in localcluster(env, "down").stderr


def test_up_restarts_only_a_component_that_died(private_cluster: tuple[Path, dict[str, str]]) -> None:
    cluster_dir, env = private_cluster
    assert localcluster(env, "up").returncode == 0
    before = pids(cluster_dir)
    os.kill(int(before["kube-scheduler"]), 9)
    again = localcluster(env, "up")
    assert again.returncode == 0, again.stderr
    after = pids(cluster_dir)
    assert after["kube-scheduler"] != before["kube-scheduler"]
    assert {k: v for k, v in after.items() if k != "kube-scheduler"} == {
        k: v for k, v in before.items() if k != "kube-scheduler"}

    # A component that is alive but slow to answer (a busy machine) is waited for, not restarted: here Kueue, stopped
    # for 5 s while `up` runs. A restart once refused another test module's queue writes meanwhile.
    kueue = int(after["kueue"])
    assert f"already running (pid {kueue})" in up_while_stopped(kueue, "kueue.py", env)
    assert pids(cluster_dir)["kueue"] == str(kueue)

    # The same for the control plane's own components: kube-scheduler stopped for 5 s while `up` runs.
    before = pids(cluster_dir)
    assert "cluster was already up" in up_while_stopped(int(before["kube-scheduler"]), "localcluster.py", env)
    assert pids(cluster_dir) == before


def up_while_stopped(pid: int, tool: str, env: dict[str, str]) -> str:
    """Runs hack/<tool> up while `pid` is SIGSTOPped for 5 s (the fault); what it printed, once it succeeded."""
    os.kill(pid, signal.SIGSTOP)
    try:
        slow = subprocess.Popen([sys.executable, str(ROOT / "hack" / tool), "up"], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with contextlib.suppress(subprocess.TimeoutExpired):
            slow.wait(timeout=5)
        assert slow.poll() is None, ("`up` must still be waiting at the fault's end", slow.communicate())
    finally:
        os.kill(pid, signal.SIGCONT)
    out, err = slow.communicate(timeout=120)
    assert slow.returncode == 0, out + err
    return out + err
