"""End to end: `pdfleet canary` through the real sglang-router to a 1 prefill + 1 decode pool of simulated
engines. Healthy, every tool request comes back with structured tool_calls and the canary passes; under each
leak fault of the simulator (injected by pod annotation, `sim.pdfleet.dev/fault`), the canary fails and names
the cause. One pool serves every mode: a fault follows its annotation both ways."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import fleet
from tests.support.canary import LEAKS, tool_answer_leaks
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

POOL = "tools"
MODEL = "qwen2.5-0.5b-instruct"


def canary(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The command as a person runs it."""
    return subprocess.run([sys.executable, "-m", "pdfleet.operator.cli", "canary", url, "--requests", "64",
                           "--concurrency", "16", "--timeout", "30", *args],
                          capture_output=True, text=True, timeout=180, check=False)


def set_fault(cluster: Cluster, namespace: str, url: str, fault: str) -> None:
    """Every engine of the pool under `fault`, and wait until the router's answers show it."""
    for pod in fleet.engine_pods(cluster, namespace, POOL):
        fleet.inject(cluster, namespace, pod["metadata"]["name"], fault)
    wait_for(f"tool answers through the router under {fault}",
             lambda: tool_answer_leaks(url, MODEL) == (fault in LEAKS), timeout=30, interval=0.3)


def test_the_canary_passes_through_the_real_router_on_a_healthy_pool_and_names_each_leak_cause(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={"replicas": 1})
    fleet.wait_ready(cluster, namespace, POOL)
    url = fleet.router_url(cluster, namespace, POOL, workers=2)

    healthy = canary(url, "--json")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    doc = json.loads(healthy.stdout)
    assert doc["passed"] and doc["model"] == MODEL
    assert doc["toolRequests"] == doc["answeredWithCalls"] == doc["structuredCalls"] == 32
    assert doc["leaks"] == {} and doc["errors"] == {}

    for fault, cause in LEAKS.items():
        set_fault(cluster, namespace, url, fault)
        sick = canary(url, "--tool-call-parser", "deepseekv32")
        assert sick.returncode == 1, f"{fault}: {sick.stdout}{sick.stderr}"
        assert f"FAIL: DSML markup in content ({cause})" in sick.stdout, sick.stdout
        others = set(LEAKS.values()) - {cause}
        assert not any(f"({other})" in sick.stdout for other in others), sick.stdout

    set_fault(cluster, namespace, url, "none")
    again = canary(url)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.rstrip().splitlines()[-1].startswith("PASS")
