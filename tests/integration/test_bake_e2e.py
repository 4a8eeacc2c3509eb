"""End to end on the local fleet: revisions that pass every gate and break only once they serve are stopped at their
canary by its bake and rolled back, under client load through the real router; a revision that goes bad in its
post-rollout watch is rolled back too.

Each bad revision is a spec change a person could make (`spec.engine.env` with the simulator's faults,
docs/local-fleet.md): its engines start, pass eventLoop and serverArgs, and then desync, crash, fail a share of
their requests or run three times slower. Nothing is injected into a running pod for those: the operator has to
find out from what the engines publish. A fifth pool rolls out a good revision that goes bad in its watch. The
pools run side by side (one operator, one namespace), each with 20+ requests/s of its own load from a client
process of its own (`pdfleet-sim load`), so the test costs one rollout's time, not five.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cli_e2e import pdfleet
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.pools import example

pytestmark = pytest.mark.cluster

MODEL = example("local-fleet")["spec"]["model"]["servedName"]
BAD = {  # pool name -> the bad revision's env
    "bake-desync": {"PDFLEET_SIM_FAULT": "desync", "PDFLEET_SIM_FAULT_AFTER_S": "8"},
    "bake-crash": {"PDFLEET_SIM_FAULT": "crash", "PDFLEET_SIM_FAULT_AFTER_S": "8"},
    "bake-failing": {"PDFLEET_SIM_FAULT": "failing", "PDFLEET_SIM_FAIL_SHARE": "0.3"},
    "bake-slow": {"PDFLEET_SIM_FAULT": "slow-requests", "PDFLEET_SIM_LATENCY_FACTOR": "3"},
}
WHY = {  # what the Warning that stops each rollout says
    "bake-desync": "its ranks are in Desync",
    "bake-crash": "its pods are not all Ready",
    "bake-failing": "analysis: error rate",
    "bake-slow": "analysis: mean inter-token latency",
}
SMALL = {"prefill": {"replicas": 1, "tp": 1, "gpusPerNode": 1}, "decode": {"replicas": 2, "tp": 1, "gpusPerNode": 1},
         "router": {"replicas": 1}}
# A desync is ranks of one engine apart in their collectives: it takes two of them.
SHAPE = {name: SMALL for name in BAD} | {"bake-desync": SMALL | {"decode": {"replicas": 2, "tp": 2, "gpusPerNode": 2}}}
CONCURRENCY = 12
WATCHED = "watched"  # the pool whose good revision goes bad in its post-rollout watch


def settled(cluster: Cluster, namespace: str, name: str, *, timeout: float = 240) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = fleet.pool(cluster, namespace, name)
        status = body.get("status") or {}
        verified = fleet.conditions_of(status).get("RolloutVerified") or {}
        ok = verified.get("status") == "True" and status.get("observedGeneration") == body["metadata"][
            "generation"] and status.get("currentRevision") == status.get("updateRevision") and \
            status.get("phase") == "Ready"
        return body if ok else None
    return wait_for(f"{name} verified and Ready", done, timeout=timeout, interval=0.5)


def engine_env(cluster: Cluster, namespace: str, name: str, values: dict[str, str]) -> None:
    cluster.kubectl("patch", "pdpool", name, "-n", namespace, "--type=merge", "-p", json.dumps(
        {"spec": {"engine": {"env": [{"name": k, "value": v} for k, v in values.items()]}}}))


class Blast:
    """Every engine group whose pods ran a revision with a simulator fault in its env, seen by polling."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.groups: dict[str, set[str]] = {}

    def look(self) -> None:
        pods = self.cluster.get("pods", "-n", self.namespace, "-l", "app.kubernetes.io/component!=router")["items"]
        for pod in pods:
            env = {e["name"] for c in pod["spec"]["containers"] for e in c.get("env") or []}
            if "PDFLEET_SIM_FAULT" in env:
                labels = pod["metadata"]["labels"]
                self.groups.setdefault(labels["pdfleet.dev/pool"], set()).add(labels["pdfleet.dev/group"])


class Load:
    """`pdfleet-sim load` at one router, a process of its own (client threads of five pools in the test's own
    process would share one GIL): its progress read as it comes, its final summary when stopped."""

    def __init__(self, url: str) -> None:
        self.started = time.monotonic()
        self._proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "pdfleet-sim"), "load", "--url", url, "--model", MODEL,
             "--concurrency", str(CONCURRENCY), "--timeout", "10", "--every", "1", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.ok = 0
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.lines.append(line.rstrip())
            if (found := re.search(r"\bok (\d+)", line)) is not None:
                self.ok = int(found.group(1))

    def stop(self) -> dict[str, Any]:
        """Stops the load (its requests finish) and returns its summary, with the rate it achieved."""
        self._proc.send_signal(signal.SIGTERM)
        self._proc.wait(timeout=60)
        self._reader.join(timeout=10)
        took = time.monotonic() - self.started
        summary = json.loads(next(line for line in reversed(self.lines) if line.startswith("{")))
        return summary | {"rate": summary["sent"] / took}


@contextlib.contextmanager
def loads(cluster: Cluster, namespace: str, names: list[str]) -> Iterator[dict[str, Load]]:
    running = {name: Load(fleet.router_url(cluster, namespace, name, workers=3)) for name in names}
    try:
        yield running
    finally:
        for load in running.values():
            with contextlib.suppress(Exception):
                load._proc.kill()


def watched_rollout(cluster: Cluster, namespace: str, name: str) -> tuple[str, str]:
    """A good revision rolled out, watched, then gone bad in its watch (one decode engine's ranks diverge):
    returns (the revision before, the one that went bad), once the rollback was announced."""
    good = fleet.pool(cluster, namespace, name)["status"]["currentRevision"]
    engine_env(cluster, namespace, name, {"PDFLEET_E2E_WATCHED": "1"})
    watching = wait_for(f"{name}'s new revision watched", lambda: (c := fleet.conditions(
        cluster, namespace, name).get("RolloutVerified") or {}).get("reason") == "Watching" and c,
        timeout=240, interval=0.5)
    assert "postRolloutWatch until" in watching["message"]
    bad = fleet.pool(cluster, namespace, name)["status"]["currentRevision"]
    assert bad != good
    shown = pdfleet(cluster, "rollout", "status", name, "-n", namespace)
    assert shown.returncode == 3 and "Watching" in shown.stdout, shown
    assert bad not in pdfleet(cluster, "rollout", "history", name, "-n", namespace).stdout, \
        "not recorded as verified while watched"
    victim = fleet.engine_pods(cluster, namespace, name, role="decode")[0]["metadata"]["name"]
    fleet.inject(cluster, namespace, victim, "desync")
    [failed] = wait_for("RolloutRevisionFailed", lambda: fleet.events(
        cluster, namespace, name, "RolloutRevisionFailed"), timeout=60, interval=0.5)
    assert f"revision {bad} failed during its postRolloutWatch" in failed["message"], failed
    return good, bad


def test_bad_revisions_are_stopped_at_their_canary_and_one_bad_in_its_watch_is_rolled_back_under_load(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    for name in BAD:
        fleet.apply_pool(cluster, namespace, name, baked=True, rollout={"verification": {"bake": "20s"}},
                         **SHAPE[name])
    fleet.apply_pool(cluster, namespace, WATCHED, baked=True,
                     rollout={"verification": {"bake": "10s"}, "postRolloutWatch": "5m"}, **SHAPE["bake-desync"])
    pools = [*BAD, WATCHED]
    good = {name: settled(cluster, namespace, name)["status"]["currentRevision"] for name in pools}
    blast = Blast(cluster, namespace)
    with loads(cluster, namespace, pools) as load:
        wait_for("the loads flowing", lambda: all(x.ok >= 40 for x in load.values()), timeout=60)
        for name, env in BAD.items():
            engine_env(cluster, namespace, name, env)
        with fleet.every(1.0, blast.look):
            watched = {name: subprocess.Popen(  # all five followed at once, as five people would
                ["pdfleet", "rollout", "status", name, "-n", namespace, "--watch", "--timeout", "5m"],
                env=cluster.env | {"PATH": f"{Path(sys.executable).parent}:{cluster.env['PATH']}"},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for name in BAD}
            before, bad = watched_rollout(cluster, namespace, WATCHED)
            outputs = {name: proc.communicate(timeout=330)[0] for name, proc in watched.items()}
            back = {name: settled(cluster, namespace, name) for name in pools}
        summaries = {name: x.stop() for name, x in load.items()}
    print("\n".join(f"{name}: {summaries[name]}, ran the bad revision: {sorted(blast.groups.get(name, ()))}"
                    for name in pools))
    for name in BAD:
        assert watched[name].returncode == 1, f"{name}: {outputs[name]}"
        assert back[name]["status"]["currentRevision"] == good[name], name
        assert "env" not in back[name]["spec"]["engine"], name
        ran = blast.groups.get(name, set())
        assert len(ran) == 1 and next(iter(ran)).startswith(f"{name}-decode-"), \
            f"{name}: one decode group, the canary, ran the bad revision; seen {ran}"
        stopped = fleet.events(cluster, namespace, name, "RolloutAnalysisFailed") + \
            fleet.events(cluster, namespace, name, "RolloutRevisionFailed")
        assert stopped and WHY[name] in stopped[0]["message"], (name, stopped)
        assert fleet.events(cluster, namespace, name, "RolloutRolledBack"), name
    for name in pools:
        assert summaries[name]["rate"] >= 20, f"{name}: the load was {summaries[name]['rate']:.1f} req/s"
    assert operator.metric("pdfleet_rollout_analysis_total", result="failed") >= 3
    # The revision that went bad in its watch: rolled back, and never recorded, so undo goes to the one before.
    assert before == good[WATCHED] and back[WATCHED]["status"]["currentRevision"] == before
    history = pdfleet(cluster, "rollout", "history", WATCHED, "-n", namespace).stdout
    assert bad not in history and before in history, history
