"""End to end: an engine that ends at start (a bad image, a patch the launcher refuses) is restarted as a unit with
backoff and within its budget, then left for a person with its exit in status; a person deleting its pod gives it
a fresh budget.

The engine pods are played by `pdfleet-sim`; the engine simulator ends at start when its environment says
`PDFLEET_SIM_FAULT=crash-at-start` (runtime/simulator/faults.py), and the runner puts its log tail in the
terminated container's message, as kubelet does with FallbackToLogsOnError.
"""

from __future__ import annotations

import datetime
import itertools
import pathlib

import pytest

from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

POOL = "tiny"
DECODE = f"{POOL}-decode-0"
BACKOFF_INITIAL_S, BACKOFF_MAX_S, BUDGET = 2, 4, 3
HEALTH = {"restartBudget": {"count": BUDGET, "window": "1h"},
          "backoff": {"initial": f"{BACKOFF_INITIAL_S}s", "max": f"{BACKOFF_MAX_S}s"}}
SLACK_S = 10  # how much later than its backoff a restart may come: the pod's end seen, then one reconcile


def decode(cluster: Cluster, namespace: str) -> dict:
    return fleet.group_status(cluster, namespace, POOL, DECODE)


def exhausted(cluster: Cluster, namespace: str) -> dict | None:
    group = decode(cluster, namespace)
    return group if group.get("budgetExhausted") else None


def ended_pod(cluster: Cluster, namespace: str) -> dict | None:
    pods = fleet.engine_pods(cluster, namespace, POOL, group=DECODE)
    return pods[0] if len(pods) == 1 and (pods[0].get("status") or {}).get("phase") == "Failed" else None


def times(stamps: list[str]) -> list[datetime.datetime]:
    return [datetime.datetime.fromisoformat(s.replace("Z", "+00:00")) for s in stamps]


def test_an_engine_that_ends_at_start_is_restarted_with_backoff_then_left_for_a_person(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    # Both roles' engines end at start (the environment is the pool's); the decode group is the one measured.
    fleet.apply_pool(cluster, namespace, POOL, base="minimal", router={"replicas": 0},
                     transfer={"backend": "fake"}, health=HEALTH,
                     engine={"env": [{"name": "PDFLEET_SIM_FAULT", "value": "crash-at-start"}]})

    group = wait_for("the decode group left for a person", lambda: exhausted(cluster, namespace),
                     timeout=120, interval=0.5)

    # Restarted within its budget, each restart after a backoff that doubles from initial up to max.
    assert (group["restarts"], group["restartCause"]) == (BUDGET, "PodEnded")
    restarted = times(group["recentRestarts"])
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(restarted)]
    print(f"restart times: {group['recentRestarts']}; intervals between restarts: {gaps} s")
    wanted = [min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** i) for i in range(BUDGET - 1)]  # [2, 4]
    assert len(gaps) == BUDGET - 1
    for gap, backoff in zip(gaps, wanted, strict=True):
        assert backoff <= gap <= backoff + SLACK_S, (gaps, wanted)
    # Its exit, as the cluster reported it, is in status: reason, exit code and the last lines it logged.
    last_exit = group["lastExit"]
    assert (last_exit["reason"], last_exit["exitCode"]) == ("Error", 1), last_exit
    assert "crash-at-start" in last_exit["message"], last_exit
    assert group["message"].startswith(f"restart budget exhausted: {BUDGET} restarts in 1h; left for a person; "
                                       f"pod {last_exit['pod']} ended (Error, exit code 1): ")
    assert "nextRestartTime" not in group
    degraded = fleet.conditions(cluster, namespace, POOL)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "RestartBudgetExhausted")

    def about_decode(reason: str) -> list[dict]:
        return [e for e in fleet.events(cluster, namespace, POOL, reason) if f"group {DECODE} " in e["message"]]
    warning = wait_for("a RestartBudgetExhausted event", lambda: about_decode("RestartBudgetExhausted"), timeout=30)
    assert len(warning) == 1 and warning[0]["type"] == "Warning"
    restart_events = about_decode("GroupRestarted")
    assert len(restart_events) == BUDGET and all("ended (Error, exit code 1)" in e["message"] for e in restart_events)
    assert about_decode("GroupRestartBackOff"), "the waits are announced"
    wait_for("the restart counter", lambda: operator.metric("pdfleet_group_restarts_total",
                                                            reason="PodEnded") >= BUDGET, timeout=30)

    # Left as it is: the ended pod stays while the operator reconciles on (its resync period is 1 s).
    pod = wait_for("the decode group's ended pod", lambda: ended_pod(cluster, namespace), timeout=30)
    reconciles = operator.metric("pdfleet_reconcile_total")
    wait_for("five more reconciles", lambda: operator.metric("pdfleet_reconcile_total") >= reconciles + 5,
             timeout=60)
    assert ended_pod(cluster, namespace)["metadata"]["uid"] == pod["metadata"]["uid"]
    assert decode(cluster, namespace)["restarts"] == BUDGET

    # A person acts: deleting the pod gives the group a fresh budget, so it is started (and restarted) again.
    cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", namespace, "--wait=false")
    wait_for("the decode group restarted again with a fresh budget",
             lambda: decode(cluster, namespace).get("restarts", 0) > BUDGET, timeout=60, interval=0.5)


def test_an_engine_whose_config_file_switches_on_a_refused_feature_ends_at_start_saying_which(
        cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: pathlib.Path) -> None:
    """Admission takes `--config FILE`; the engine launcher merges the file as SGLang would and refuses to start,
    naming the flag the file sets, and that line reaches the group's status."""
    config = tmp_path / "server.yaml"
    config.write_text("context-length: 4096\nenable-lora: true\n")
    tmp_path.chmod(0o755)
    config.chmod(0o644)
    fleet.apply_pool(cluster, namespace, POOL, base="minimal", router={"replicas": 0},
                     transfer={"backend": "fake"}, health={**HEALTH, "restartBudget": {"count": 1, "window": "1h"}},
                     engine={"extraArgs": ["--config", str(config)]})
    group = wait_for("the decode group left for a person", lambda: exhausted(cluster, namespace),
                     timeout=120, interval=0.5)
    last_exit = group["lastExit"]
    assert last_exit["exitCode"] == 2, last_exit
    assert f"the --config file {config} sets what a pdfleet engine may not take from it (--enable-lora: refused: " \
           "LoRA adapters" in last_exit["message"], last_exit
