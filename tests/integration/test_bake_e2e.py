"""End to end on the local fleet: revisions that pass every gate and break only once they serve are stopped at their
canary by its bake and rolled back, under client load through the real router; a revision that goes bad in its
post-rollout watch is rolled back too.

Each bad revision is a spec change a person could make (`spec.engine.env` with the simulator's faults,
docs/local-fleet.md): its engines start, pass eventLoop and serverArgs, and then desync, crash, fail a share of
their requests or run three times slower. Nothing is injected into a running pod for those: the operator has to
find out from what the engines publish. The pools run side by side (one operator, one namespace), each with
20+ requests/s of its own load, so the test costs one rollout's time, not four.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
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
CONCURRENCY = 8


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


@contextlib.contextmanager
def loads(cluster: Cluster, namespace: str, names: list[str]) -> Iterator[dict[str, Any]]:
    with contextlib.ExitStack() as stack:
        out = {}
        for name in names:
            url = fleet.router_url(cluster, namespace, name, workers=3)
            out[name] = stack.enter_context(fleet.steady_load(url, model=MODEL, concurrency=CONCURRENCY))
        yield out


def test_bad_revisions_are_stopped_at_their_canary_by_the_bake_and_rolled_back_under_load(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    for name in BAD:
        fleet.apply_pool(cluster, namespace, name, baked=True, rollout={"verification": {"bake": "30s"}},
                         **SHAPE[name])
    good = {name: settled(cluster, namespace, name)["status"]["currentRevision"] for name in BAD}
    blast = Blast(cluster, namespace)
    with loads(cluster, namespace, list(BAD)) as load:
        wait_for("the loads flowing", lambda: all(x.tally.ok >= 40 for x in load.values()), timeout=60)
        started = time.monotonic()
        sent = {name: x.tally.sent for name, x in load.items()}
        for name, env in BAD.items():
            engine_env(cluster, namespace, name, env)
        with fleet.every(1.0, blast.look):
            watched = {name: pdfleet(cluster, "rollout", "status", name, "-n", namespace, "--watch", "--timeout",
                                     "5m", timeout=330) for name in BAD}
            back = {name: settled(cluster, namespace, name) for name in BAD}
        took = time.monotonic() - started
        rates = {name: (x.tally.sent - sent[name]) / took for name, x in load.items()}
    report = [f"{name}: {load[name].tally.summary()}, {rates[name]:.1f} req/s, ran the bad revision: "
              f"{sorted(blast.groups.get(name, ()))}" for name in BAD]
    print("\n".join(report))
    for name in BAD:
        assert watched[name].returncode == 1, f"{name}: {watched[name].stdout}{watched[name].stderr}"
        assert back[name]["status"]["currentRevision"] == good[name], name
        assert "env" not in back[name]["spec"]["engine"], name
        ran = blast.groups.get(name, set())
        assert len(ran) == 1 and next(iter(ran)).startswith(f"{name}-decode-"), \
            f"{name}: one decode group, the canary, ran the bad revision; seen {ran}"
        stopped = fleet.events(cluster, namespace, name, "RolloutAnalysisFailed") + \
            fleet.events(cluster, namespace, name, "RolloutRevisionFailed")
        assert stopped and WHY[name] in stopped[0]["message"], (name, stopped)
        assert fleet.events(cluster, namespace, name, "RolloutRolledBack"), name
        assert rates[name] >= 20, f"{name}: the load was {rates[name]:.1f} req/s, not the 20 asked for"
    assert operator.metric("pdfleet_rollout_analysis_total", result="failed") >= 3


def test_a_revision_that_goes_bad_in_its_post_rollout_watch_is_rolled_back_and_never_recorded(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    name = "watched"
    fleet.apply_pool(cluster, namespace, name, baked=True,
                     rollout={"verification": {"bake": "10s"}, "postRolloutWatch": "5m"},
                     **SHAPE["bake-desync"])
    good = settled(cluster, namespace, name)["status"]["currentRevision"]
    with loads(cluster, namespace, [name]) as load:
        wait_for("the load flowing", lambda: load[name].tally.ok >= 40, timeout=60)
        engine_env(cluster, namespace, name, {"PDFLEET_E2E_WATCHED": "1"})
        watching = wait_for("the new revision watched", lambda: (c := fleet.conditions(
            cluster, namespace, name).get("RolloutVerified") or {}).get("reason") == "Watching" and c,
            timeout=240, interval=0.5)
        assert "postRolloutWatch until" in watching["message"]
        bad = fleet.pool(cluster, namespace, name)["status"]["currentRevision"]
        assert bad != good
        shown = pdfleet(cluster, "rollout", "status", name, "-n", namespace)
        assert shown.returncode == 3 and "Watching" in shown.stdout, shown
        assert pdfleet(cluster, "rollout", "history", name, "-n", namespace).stdout.count(bad) == 0, \
            "not recorded as verified while watched"
        # Now it goes bad while it serves: one decode engine's ranks diverge.
        victim = fleet.engine_pods(cluster, namespace, name, role="decode")[0]["metadata"]["name"]
        fleet.inject(cluster, namespace, victim, "desync")
        [failed] = wait_for("RolloutRevisionFailed", lambda: fleet.events(
            cluster, namespace, name, "RolloutRevisionFailed"), timeout=60, interval=0.5)
        assert f"revision {bad} failed during its postRolloutWatch" in failed["message"], failed
        back = settled(cluster, namespace, name)
    print(f"client requests: {load[name].tally.summary()}")
    assert back["status"]["currentRevision"] == good
    history = pdfleet(cluster, "rollout", "history", name, "-n", namespace).stdout
    assert bad not in history and good in history, history
