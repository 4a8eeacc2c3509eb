"""End to end on the local fleet: revisions that pass every gate and break only once they serve are stopped at their
canary by its bake and rolled back, under client load through the real router; a revision that goes bad in its
post-rollout watch is rolled back too.

Each bad revision is a spec change a person could make (`spec.engine.env` with the simulator's faults,
docs/local-fleet.md): its engines start, pass eventLoop and serverArgs, and then desync, crash, fail a share of
their requests or run three times slower; or they leak DSML into their answers, which the toolCallCanary gate
(on here) catches before the bake. Nothing is injected into a running pod for those: the operator has to find
out from what the engines publish and answer. They are rolled out one after the other on one pool (two prefill groups,
two decode groups at TP 2: a desync takes two ranks, two router replicas) under 20+ requests/s through both routers
from a client process of its own (`pdfleet-sim load --pool`); then a good revision that goes bad in its watch.

Each router pod is also asked directly a few times a second throughout, Ready or not: after a bad canary's rollback,
or several in a row, no router may be left answering `503 No available ... workers` (the pool keeps a serving group
of each role all along). With sglang-router's circuit breakers on, requests failed by a hung canary used to open
the circuits of the healthy workers they were paired with, for a minute (docs/router.md).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cli_e2e import pdfleet
from tests.support import fleet, router_probe
from tests.support.cluster import Cluster, WaitTimeout, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.pools import example

pytestmark = pytest.mark.cluster

MODEL = example("local-fleet")["spec"]["model"]["servedName"]
BAD = {  # bad revision kind -> its env
    "desync after 8 s": {"PDFLEET_SIM_FAULT": "desync", "PDFLEET_SIM_FAULT_AFTER_S": "8"},
    "crash after 8 s": {"PDFLEET_SIM_FAULT": "crash", "PDFLEET_SIM_FAULT_AFTER_S": "8"},
    "30% failing": {"PDFLEET_SIM_FAULT": "failing", "PDFLEET_SIM_FAIL_SHARE": "0.3"},
    "3x slower": {"PDFLEET_SIM_FAULT": "slow-requests", "PDFLEET_SIM_LATENCY_FACTOR": "3"},
    "tool calls leaking": {"PDFLEET_SIM_FAULT": "leak-parser-off"},  # DSML in content: the canary's gate
}
WHY = {  # what the Warning that stops each rollout says: its bake failed, or (before the bake began) the revision
    "desync after 8 s": ("its ranks are in Desync", "turned Desync"),
    "crash after 8 s": ("its pods are not all Ready", "ended"),
    "30% failing": ("analysis: error rate",),
    "3x slower": ("analysis: mean inter-token latency",),
    "tool calls leaking": ("gate toolCallCanary failed",),
}
# Two groups of each role: with one, replacing it (the good revision's rollout, the rollback) leaves the router
# without a worker of that role until the new one is up: an outage that is the shape's, not the revision's.
SHAPE = {"prefill": {"replicas": 2, "tp": 1, "gpusPerNode": 1}, "decode": {"replicas": 2, "tp": 2, "gpusPerNode": 2},
         "router": {"replicas": 2}}
POOL = "baked"
CONCURRENCY = 12
NO_WORKERS_S = 5.0  # the longest a router may answer "no available workers": a router's own bookkeeping, no more


def settled(cluster: Cluster, namespace: str, name: str, *, timeout: float = 360) -> dict[str, Any]:
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
    """Every engine group whose pods ran each faulty revision (by the fault in their env), and the fewest groups
    of each role that served at once (every pod Ready, none terminating), seen by polling."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.groups: dict[str, set[str]] = {}
        self.least: dict[str, int] = {}

    def look(self) -> None:
        pods = self.cluster.get("pods", "-n", self.namespace, "-l", "app.kubernetes.io/component!=router")["items"]
        members: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            env = {e["name"]: e.get("value") for c in pod["spec"]["containers"] for e in c.get("env") or []}
            if "PDFLEET_SIM_FAULT" in env:
                self.groups.setdefault(str(env["PDFLEET_SIM_FAULT"]), set()).add(
                    pod["metadata"]["labels"]["pdfleet.dev/group"])
            members.setdefault(pod["metadata"]["labels"]["pdfleet.dev/group"], []).append(pod)
        serving = [group for group, mine in members.items() if all(
            not p["metadata"].get("deletionTimestamp") and any(
                c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])
            for p in mine)]
        for role in ("prefill", "decode"):
            count = sum(f"-{role}-" in group for group in serving)
            self.least[role] = min(self.least.get(role, count), count)


class Load:
    """`pdfleet-sim load` at every Ready router of the pool, a process of its own (the test's own process is busy
    with kubectl and the CLI): its progress read as it comes, its final summary when stopped."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.started = time.monotonic()
        self._proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "pdfleet-sim"), "load", "--pool", f"{namespace}/{POOL}",
             "--kubeconfig", str(cluster.kubeconfig), "--model", MODEL,
             "--concurrency", str(CONCURRENCY), "--timeout", "10", "--every", "1", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.ok = self.failed = 0
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.lines.append(line.rstrip())
            if (found := re.search(r"\bok (\d+)", line)) is not None:
                self.ok = int(found.group(1))
            if (found := re.search(r"\bfailed (\d+)", line)) is not None:
                self.failed = int(found.group(1))

    def stop(self) -> dict[str, Any]:
        """Stops the load (its requests finish) and returns its summary, with the rate it achieved."""
        self._proc.send_signal(signal.SIGTERM)
        self._proc.wait(timeout=60)
        self._reader.join(timeout=10)
        took = time.monotonic() - self.started
        summary = json.loads(next(line for line in reversed(self.lines) if line.startswith("{")))
        return summary | {"rate": summary["sent"] / took}


def watched_rollout(cluster: Cluster, namespace: str, blast: Blast, load: Load) -> tuple[str, str, int]:
    """A good revision rolled out with maxSurge (no role ever serves on fewer groups than replicas, no client
    request fails), watched, then gone bad in its watch (one decode engine's ranks diverge): returns (the revision
    before, the one that went bad, client requests failed while it rolled out), once the failure was announced."""
    good = fleet.pool(cluster, namespace, POOL)["status"]["currentRevision"]
    failed_before, blast.least = load.failed, {}
    cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": {
        "engine": {"env": [{"name": "PDFLEET_E2E_WATCHED", "value": "1"}]},
        "rollout": {"verification": {"bake": "5s"}, "postRolloutWatch": "5m",
                    "maxSurge": {"prefill": 1, "decode": 1}}}}))
    try:
        watching = wait_for("the new revision watched", lambda: (c := fleet.conditions(
            cluster, namespace, POOL).get("RolloutVerified") or {}).get("reason") == "Watching" and c,
            timeout=420, interval=0.5)  # four groups in turn, each started and baked: 240 s ran out once under load
    except WaitTimeout as e:
        status = fleet.pool(cluster, namespace, POOL).get("status") or {}
        raise AssertionError(f"{e}\nconditions: {status.get('conditions')}\ngroups: {status.get('groups')}\n" +
                             "\n".join(fleet.event_lines(cluster, namespace))) from None
    assert "postRolloutWatch until" in watching["message"]
    rollout_failed = load.failed - failed_before
    assert rollout_failed == 0, f"{rollout_failed} client request(s) failed while a good revision rolled out"
    assert blast.least == {"prefill": SHAPE["prefill"]["replicas"], "decode": SHAPE["decode"]["replicas"]}, \
        f"with maxSurge every role kept its replicas serving: {blast.least}"
    surged = [e["message"] for e in fleet.events(cluster, namespace, POOL, "GroupCreated")
              if "above replicas (maxSurge)" in e["message"]]
    assert len(surged) == 2, surged  # one surge group per role
    bad = fleet.pool(cluster, namespace, POOL)["status"]["currentRevision"]
    assert bad != good
    shown = pdfleet(cluster, "rollout", "status", POOL, "-n", namespace)
    assert shown.returncode == 3 and "Watching" in shown.stdout, shown
    assert bad not in pdfleet(cluster, "rollout", "history", POOL, "-n", namespace).stdout, \
        "not recorded as verified while watched"
    victim = fleet.engine_pods(cluster, namespace, POOL, role="decode")[0]["metadata"]["name"]
    fleet.inject(cluster, namespace, victim, "desync")
    [failed] = wait_for("RolloutRevisionFailed", lambda: fleet.events(
        cluster, namespace, POOL, "RolloutRevisionFailed"), timeout=60, interval=0.5)
    assert f"revision {bad} failed during its postRolloutWatch" in failed["message"], failed
    return good, bad, rollout_failed


def test_bad_revisions_are_stopped_at_their_canary_and_one_bad_in_its_watch_is_rolled_back_under_load(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    # The bad revisions replace in place (the default): their canary is an old group replaced, rolled back in
    # place. The good revision of the watch story rolls out with maxSurge.
    fleet.apply_pool(cluster, namespace, POOL, baked=True, model={"toolCallParser": "deepseekv32"}, rollout={
        "verification": {"bake": "20s", "toolCallCanary": True}, "maxSurge": {"prefill": 0, "decode": 0}},
        **SHAPE)
    good = settled(cluster, namespace, POOL)["status"]["currentRevision"]
    blast = Blast(cluster, namespace)
    fleet.router_url(cluster, namespace, POOL, workers=4)
    load = Load(cluster, namespace)
    report: list[str] = []
    port = fleet.pool(cluster, namespace, POOL)["spec"]["router"]["port"]
    probed = router_probe.sampling(lambda: router_probe.pod_urls(fleet.router_pods(cluster, namespace, POOL), port))
    try:
        wait_for("the load flowing", lambda: load.ok >= 40, timeout=60)
        with fleet.every(1.0, blast.look), probed as samples:
            for kind, env in BAD.items():
                started, failed_before = time.monotonic(), load.failed
                engine_env(cluster, namespace, POOL, env)
                watched = pdfleet(cluster, "rollout", "status", POOL, "-n", namespace, "--watch", "--timeout",
                                  "4m", timeout=270)
                back = settled(cluster, namespace, POOL)
                stuck = router_probe.longest_no_workers(samples, since=started)
                report.append(f"{kind}: stopped and rolled back in {time.monotonic() - started:.0f} s, client "
                              f"requests failed meanwhile: {load.failed - failed_before}, longest 'no available "
                              f"workers' per router: {stuck}")
                assert watched.returncode == 1, f"{kind}: {watched.stdout}{watched.stderr}"
                assert back["status"]["currentRevision"] == good and "env" not in back["spec"]["engine"], kind
                fault = env["PDFLEET_SIM_FAULT"]
                ran = blast.groups.get(fault, set())
                assert len(ran) == 1 and next(iter(ran)).startswith(f"{POOL}-decode-"), \
                    f"{kind}: one decode group, the canary, ran the bad revision; seen {ran}"
                stopped = [e for reason in ("RolloutAnalysisFailed", "RolloutRevisionFailed", "RolloutGateFailed")
                           for e in fleet.events(cluster, namespace, POOL, reason)
                           if any(why in e["message"] for why in WHY[kind])]
                assert stopped, (kind, fleet.event_lines(cluster, namespace))
            before, bad, rollout_failed = watched_rollout(cluster, namespace, blast, load)
            failed_before = load.failed
            back = settled(cluster, namespace, POOL)
            report.append(f"a good revision with maxSurge: client requests failed while it rolled out: "
                          f"{rollout_failed}; gone bad in its watch: rolled back, client requests failed meanwhile: "
                          f"{load.failed - failed_before}")
    finally:
        summary = load.stop()
        print("\n".join(report), f"\nclient requests: {summary}", sep="")
    assert len({s.router for s in samples}) >= 2, "both routers were asked"
    # After each bad canary's rollback, five of them in a row, and the watched revision's: no router was left
    # without a worker of a role (the pool kept a serving group of each).
    stuck = router_probe.longest_no_workers(samples, since=0.0)
    assert max(stuck.values()) <= NO_WORKERS_S, (f"a router answered 'no available workers' for {stuck} s",
                                                  *fleet.event_lines(cluster, namespace))
    assert len(fleet.events(cluster, namespace, POOL, "RolloutRolledBack")) == len(BAD) + 1
    assert summary["rate"] >= 20, f"the load was {summary['rate']:.1f} req/s, not the 20 asked for"
    # Only requests in flight where a bad revision broke fail (a few per revision here), not an outage.
    assert summary["failed"] <= 0.01 * summary["sent"], summary
    assert operator.metric("pdfleet_rollout_analysis_total", result="failed") >= 3
    # The revision that went bad in its watch: rolled back, and never recorded, so undo goes to the one before.
    assert before == good and back["status"]["currentRevision"] == good
    history = pdfleet(cluster, "rollout", "history", POOL, "-n", namespace).stdout
    assert bad not in history and good in history, history
