"""End to end: the operator SIGKILLed at random moments of a rollout, and started again each time, finishes the
same rollout from what the cluster holds: every group verified on the new revision, each replaced exactly once,
never two Events for one step. Nothing of a rollout lives only in the operator's memory.

The operator here is this test's own process (the chart's ServiceAccount token, `--namespace` of the test), not
the module-wide one, so that it can be killed without a word. The moments are random but seeded, and the seed is
printed: a failure can be run again as it happened (`PDFLEET_SIGKILL_SEED`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.integration.test_rollout_under_load_e2e import PodWatch
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess, token_kubeconfig
from tests.support.release import RELEASE_NAMESPACE, SERVICE_ACCOUNT

pytestmark = pytest.mark.cluster

POOL = "underload"  # PodWatch follows this pool's engine pods
KILLS = 5
GROUPS = [f"{POOL}-decode-0", f"{POOL}-decode-1", f"{POOL}-prefill-0", f"{POOL}-prefill-1"]


def rolled_out(cluster: Cluster, namespace: str, first: str | None) -> str | None:
    status = fleet.pool(cluster, namespace, POOL).get("status") or {}
    verified = (fleet.conditions_of(status).get("RolloutVerified") or {}).get("status") == "True"
    current = status.get("currentRevision")
    done = verified and current and current == status.get("updateRevision") != first and status.get("phase") == "Ready"
    return current if done else None


class Operators:
    """The operator, started again after every kill; every log kept for a failure's story."""

    def __init__(self, cluster: Cluster, namespace: str, tmp: Path) -> None:
        self.kubeconfig = token_kubeconfig(cluster, RELEASE_NAMESPACE, SERVICE_ACCOUNT, tmp / "kubeconfig")
        self.namespace, self.tmp = namespace, tmp
        self.started: list[OperatorProcess] = []

    def start(self) -> OperatorProcess:
        op = OperatorProcess(self.kubeconfig, self.tmp / f"operator-{len(self.started)}.log",
                             "--namespace", self.namespace, "--resync-period", "1")
        self.started.append(op)
        op.wait_ready()
        return op

    def kill(self, op: OperatorProcess) -> None:
        os.killpg(op.proc.pid, signal.SIGKILL)  # the whole session: no handler runs, nothing is flushed
        op.proc.wait(timeout=30)

    def stop_all(self) -> None:
        for op in self.started:
            op.stop()

    def tracebacks(self) -> list[str]:
        return [op.log_path.name for op in self.started if "Traceback" in op.logs()]


def baking(cluster: Cluster, namespace: str) -> dict[str, str]:
    """Group -> when its bake began, for the groups the status says are baking now."""
    groups = (fleet.pool(cluster, namespace, POOL).get("status") or {}).get("groups") or []
    return {g["name"]: g["verification"]["bake"]["since"] for g in groups
            if (g.get("verification") or {}).get("bake") and g.get("verifiedRevision") != g["revision"]}


def test_an_operator_killed_five_times_mid_rollout_finishes_it_verified_replacing_each_group_once(
        cluster: Cluster, chart: None, namespace: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("PDFLEET_SIGKILL_SEED") or random.SystemRandom().randrange(1 << 30))
    rng = random.Random(seed)
    print(f"PDFLEET_SIGKILL_SEED={seed}")
    operators = Operators(cluster, namespace, tmp_path)
    try:
        op = operators.start()
        # Each new group bakes, so that kills land in bakes too: a restarted operator must resume the same one.
        fleet.apply_pool(cluster, namespace, POOL, rollout={"verification": {"bake": "8s"}, "postRolloutWatch": "5s"})
        first = wait_for("the pool Ready and verified", lambda: rolled_out(cluster, namespace, None), timeout=240,
                         interval=0.5)
        before = {g: {p["metadata"]["uid"] for p in fleet.engine_pods(cluster, namespace, POOL, group=g)}
                  for g in GROUPS}
        assert all(len(u) == 1 for u in before.values()), before
        old_revisions = {g["name"]: g["revision"] for g in fleet.pool(cluster, namespace, POOL)["status"]["groups"]}

        watch = PodWatch(cluster, namespace)
        cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p",
                        json.dumps({"spec": {"engine": {"overlapSchedule": "Disabled"}}}))
        moments = []
        bakes: dict[str, str] = {}  # group -> when its bake began, as seen between kills
        for _ in range(KILLS):
            # Random moments within the rollout's first steps: a group's replacement takes a few seconds here.
            delay = rng.uniform(0.2, 3.0)
            time.sleep(delay)  # the moment of the kill is the point: any moment must be safe
            moments.append(f"{delay:.2f}s: {(fleet.pool(cluster, namespace, POOL).get('status') or {}).get('phase')}")
            operators.kill(op)
            bakes |= baking(cluster, namespace)
            op = operators.start()
        # And once more while a group is known to be baking, whatever the random moments hit.
        bakes |= wait_for("a group baking", lambda: baking(cluster, namespace), timeout=120, interval=0.2)
        operators.kill(op)
        op = operators.start()
        print("killed after (delay: phase seen then):", "; ".join(moments), "; bakes seen:", bakes)
        done = wait_for("the rollout verified", lambda: rolled_out(cluster, namespace, first), timeout=300,
                        interval=0.5)
        seen = watch.stop()
    finally:
        operators.stop_all()

    status = fleet.pool(cluster, namespace, POOL)["status"]
    assert status["currentRevision"] == done
    expected_loop = {"prefill": "event_loop_normal_disagg_prefill", "decode": "event_loop_normal_disagg_decode"}
    for group in status["groups"]:
        assert group["eventLoop"] == expected_loop[group["role"]], group
        assert group["verifiedRevision"] == group["revision"] != old_revisions[group["name"]], group
        assert group["restarts"] == 0, group
    for group in status["groups"]:
        if group["name"] in bakes:  # a bake a kill interrupted went on from where it began
            assert group["verification"]["bake"]["since"] == bakes[group["name"]], (group, bakes)
    # Each group replaced exactly once: its old pod and one new pod, whatever the kills interrupted.
    after = {g: {p["metadata"]["uid"] for p in fleet.engine_pods(cluster, namespace, POOL, group=g)} for g in GROUPS}
    for group in GROUPS:
        assert len(after[group]) == 1 and not after[group] & before[group], (group, before[group], after[group])
        assert seen[group] == before[group] | after[group], (group, seen[group], fleet.event_lines(cluster, namespace))
    # At most one Event per step: a step replayed by a restarted operator must not post its GroupReplaced again.
    # Not exactly one: a kill between a step's writes and its Event loses that Event, as with any controller
    # (Events are best effort; the pods and the status above are the record, and they are whole).
    replaced = fleet.events(cluster, namespace, POOL, "GroupReplaced")
    named = sorted(e["message"].split(" group ")[1].split(" ")[0] for e in replaced)
    assert len(named) == len(set(named)) and set(named) <= set(GROUPS), fleet.event_lines(cluster, namespace)
    assert all(e["count"] == 1 for e in replaced), [(e["message"], e["count"]) for e in replaced]
    assert operators.tracebacks() == []
