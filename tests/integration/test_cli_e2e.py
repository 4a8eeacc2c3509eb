"""End to end: the `pdfleet` CLI, run as people run it (the installed console scripts, as a subprocess, with the
test's KUBECONFIG), against a pool the operator rolls out on the local cluster (as in
`test_verified_rollout_e2e.py`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import fleet
from tests.support.cluster import Cluster
from tests.support.operator_process import OperatorProcess, token_kubeconfig

pytestmark = pytest.mark.cluster

POOL = "cli"
ONE_AND_ONE = {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}
SCRIPTS = Path(sys.executable).parent  # the console scripts live next to the interpreter


def pdfleet(cluster: Cluster, *args: str, script: str = "pdfleet", timeout: float = 240,
            kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = cluster.env | {"PATH": f"{SCRIPTS}:{cluster.env['PATH']}"}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    command = [script, *args] if script != "kubectl" else ["kubectl", "pdfleet", *args]
    return subprocess.run(command, text=True, capture_output=True, env=env, timeout=timeout)


def test_rollout_status_follows_a_verified_rollout_and_status_shows_the_groups(
        cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path) -> None:
    fleet.apply_pool(cluster, namespace, POOL, **ONE_AND_ONE)
    first = pdfleet(cluster, "rollout", "status", POOL, "-n", namespace, "--watch", "--timeout", "3m")
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.splitlines()[-1].endswith("complete: 2/2 groups verified; every group of revision "
                                                  f"{fleet.pool(cluster, namespace, POOL)['status']['updateRevision']}"
                                                  " passed verification")

    # Paused with the change, so that the watch's first line is certainly of a rollout not done yet (a CLI slow to
    # start on a loaded machine would otherwise see a two-group rollout already finished); resumed once it said so.
    cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"engine": {"overlapSchedule": "Disabled"}, "rollout": {"paused": True}}}))
    env = cluster.env | {"PATH": f"{SCRIPTS}:{cluster.env['PATH']}"}
    with subprocess.Popen(["pdfleet", "rollout", "status", POOL, "-n", namespace, "--watch", "--timeout", "3m"],
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as watch:
        assert watch.stdout is not None
        first = watch.stdout.readline()
        cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p",
                        json.dumps({"spec": {"rollout": {"paused": False}}}))
        rest, errors = watch.communicate(timeout=240)
    assert watch.returncode == 0, first + rest + errors
    lines = (first + rest).splitlines()
    # Paused (or, before the operator saw the change, waiting for it): either way not done.
    assert "PAUSED" in lines[0] or "in progress" in lines[0], "the rollout was paused: it cannot be done yet"
    assert len(lines) >= 2 and not any("\r" in line or "[#" in line for line in lines), "no bar off a terminal"
    status = fleet.pool(cluster, namespace, POOL)["status"]
    assert status["currentRevision"] == status["updateRevision"]
    assert lines[-1] == (f"pool {namespace}/{POOL}: rollout of revision {status['updateRevision']} complete: "
                         f"2/2 groups verified; every group of revision {status['updateRevision']} passed "
                         "verification")
    assert {g["eventLoop"] for g in status["groups"]} == {"event_loop_normal_disagg_prefill",
                                                          "event_loop_normal_disagg_decode"}

    # Once done, without --watch: one line, exit 0; and as a kubectl plugin.
    once = pdfleet(cluster, "rollout", "status", POOL, "-n", namespace, script="kubectl")
    assert (once.returncode, once.stdout.splitlines()) == (0, [lines[-1]]), once.stderr

    shown = pdfleet(cluster, "status", POOL, "-n", namespace, script="kubectl-pdfleet")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout.splitlines()
    assert "Phase:      Ready" in out
    assert f"Revision:   current {status['updateRevision']}, update {status['updateRevision']}" in out
    for group in status["groups"]:
        row = next(line.split() for line in out if line.strip().startswith(group["name"] + " "))
        assert row == [group["name"], group["revision"], "Healthy", "1/1", "yes", "0"], shown.stdout
    assert "Conditions: all fine" in out


def test_errors_are_one_line_with_exit_2(cluster: Cluster, operator: OperatorProcess, namespace: str,
                                         tmp_path: Path) -> None:
    missing = pdfleet(cluster, "status", "nosuch", "-n", namespace)
    assert (missing.returncode, missing.stderr) == (
        2, f'error: InferencePool "nosuch" not found in namespace "{namespace}"\n')
    also = pdfleet(cluster, "rollout", "status", "nosuch", "-n", namespace, "--watch")
    assert (also.returncode, also.stderr) == (2, missing.stderr)

    # A ServiceAccount with no RBAC at all: the apiserver's refusal, on one line.
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    nobody = token_kubeconfig(cluster, namespace, "nobody", tmp_path / "kubeconfig")
    denied = pdfleet(cluster, "rollout", "status", POOL, "-n", namespace, kubeconfig=nobody)
    assert denied.returncode == 2
    assert denied.stderr.startswith("error: forbidden: inferencepools.pdfleet.dev \"cli\" is forbidden: User "
                                    f"\"system:serviceaccount:{namespace}:nobody\" cannot get resource")
    assert denied.stderr.count("\n") == 1 and "Traceback" not in denied.stderr
