"""End to end: the operator judges rank health through real agents and tells the truth in status and events.

The chart and the operator run exactly as in `test_operator_e2e.py`. Engine pods run no processes here (kwok),
but their IPs are loopback addresses, so this test binds a real rank-health agent on each engine pod's IP and
agent port, serving a ledger that fake ranks in this process write with the runtime's own writer.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.operator.render.engine_group import AGENT_PORT
from pdfleet.runtime.health import agent, attach, phases
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.pools import example

pytestmark = pytest.mark.cluster

P = phases.Phase
HEARTBEAT_S, DESYNC_AFTER_S = 1.0, 2.0
STEP_S = 0.05  # one fake scheduler iteration


class FakeRanks:
    """The scheduler ranks of one engine pod, stepping in lockstep from a thread until paused."""

    def __init__(self, ledger: Path, ranks: int, loop: phases.LoopName) -> None:
        self.writers = [attach.attach_rank(slot=r, rank=r, slots=ranks, path=ledger, stack_signal=None)
                        for r in range(ranks)]
        for w in self.writers:
            w.set_loop(loop)
            w.begin(P.LOCAL)
        self._lock = threading.Lock()
        self._running = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(STEP_S):
            with self._lock:
                if not self._running.is_set():
                    continue
                for w in self.writers:
                    w.collective(P.RECV_BROADCAST)
                    w.begin(P.FORWARD)
                    w.step()

    def progress(self) -> None:
        self._running.set()

    def hold(self, *positions: P) -> None:
        """Stops stepping and leaves rank i blocked in collective `positions[i]`."""
        with self._lock:
            self._running.clear()
            for w, phase in zip(self.writers, positions, strict=True):
                w.collective(phase)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for w in self.writers:
            w.close()


def engine_pods(cluster: Cluster, namespace: str) -> list[dict]:
    return cluster.get("pods", "-n", namespace, "-l",
                       "pdfleet.dev/pool=tiny,app.kubernetes.io/component!=router")["items"]


def ready_with_ip(pod: dict) -> bool:
    status = pod.get("status") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
    return ready and bool(status.get("podIP"))


HEALTH = {"heartbeatPeriod": "1s", "desyncAfter": "2s", "hangAfter": "4s"}


@pytest.fixture
def fleet(cluster: Cluster, operator: OperatorProcess, namespace: str,
          tmp_path: Path) -> Iterator[dict[str, FakeRanks]]:
    """A pool with prefill at tp 1 and decode at tp 2, and a real agent on every engine pod's IP serving
    ranks that make progress; by group name. It detects and reports only (restartBudget.count 0)."""
    with running_fleet(cluster, namespace, tmp_path, {**HEALTH, "restartBudget": {"count": 0}}) as groups:
        yield groups


@pytest.fixture
def restarting_fleet(cluster: Cluster, operator: OperatorProcess, namespace: str,
                     tmp_path: Path) -> Iterator[dict[str, FakeRanks]]:
    """The same pool, acting on sick groups: evidence, then a restart; the backoff keeps it to one restart."""
    health = {**HEALTH, "restartBudget": {"count": 3, "window": "1h"}, "backoff": {"initial": "5m", "max": "10m"}}
    with running_fleet(cluster, namespace, tmp_path, health) as groups:
        yield groups


@contextlib.contextmanager
def running_fleet(cluster: Cluster, namespace: str, tmp_path: Path, health: dict) -> Iterator[dict[str, FakeRanks]]:
    body = example("minimal")
    body["metadata"] = {"name": "tiny", "namespace": namespace}
    body["spec"]["decode"].update({"tp": 2, "gpusPerNode": 2})
    body["spec"]["health"] = health
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    pods = wait_for("both engine pods Ready with an IP", lambda: (lambda ps: ps if len(ps) == 2 and all(
        ready_with_ip(p) for p in ps) else None)(engine_pods(cluster, namespace)), timeout=120)
    groups: dict[str, FakeRanks] = {}
    with contextlib.ExitStack() as stack:
        for pod in pods:
            group = pod["metadata"]["labels"]["pdfleet.dev/group"]
            ledger = tmp_path / f"ledger-{pod['metadata']['name']}"
            decode = pod["metadata"]["labels"]["pdfleet.dev/role"] == "decode"
            loop = phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE if decode else \
                phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_PREFILL
            ranks = FakeRanks(ledger, 2 if decode else 1, loop)
            stack.callback(ranks.close)
            # Exactly the pod's address: never 0.0.0.0, so other pods' addresses stay silent.
            stack.enter_context(agent.Agent(ledger, host=pod["status"]["podIP"], port=AGENT_PORT))
            ranks.progress()
            groups[group] = ranks
        yield groups


def group_status(cluster: Cluster, namespace: str, group: str) -> dict:
    status = cluster.get("pdpool", "tiny", "-n", namespace).get("status") or {}
    return next((g for g in status.get("groups", []) if g["name"] == group), {})


def conditions(cluster: Cluster, namespace: str) -> dict[str, dict]:
    status = cluster.get("pdpool", "tiny", "-n", namespace).get("status") or {}
    return {c["type"]: c for c in status.get("conditions", [])}


def events(cluster: Cluster, namespace: str, reason: str) -> list[dict]:
    return cluster.get("events", "-n", namespace, "--field-selector",
                       f"involvedObject.name=tiny,reason={reason}")["items"]


def test_a_desync_is_reported_within_seconds_and_its_recovery_too(
        cluster: Cluster, operator: OperatorProcess, namespace: str, fleet: dict[str, FakeRanks]) -> None:
    decode = "tiny-decode-0"

    healthy = wait_for("the decode group Healthy", lambda: (lambda g: g if g.get("verdict") == "Healthy" else None)(
        group_status(cluster, namespace, decode)), timeout=60)
    assert (healthy["eventLoop"], healthy["ranks"]) == ("event_loop_normal_disagg_decode", 2)
    wait_for("the pool Ready", lambda: conditions(cluster, namespace).get("Ready", {}).get("status") == "True",
             timeout=60)
    assert group_status(cluster, namespace, "tiny-prefill-0")["verdict"] == "Healthy"

    # Rank 0 waits for the next request broadcast while rank 1 polls KV transfers: the overlap-abort desync.
    diverged_at = time.monotonic()
    fleet[decode].hold(P.RECV_BROADCAST, P.KV_POLL_ALL_REDUCE)
    desync = wait_for("the decode group in Desync", lambda: (lambda g: g if g.get("verdict") == "Desync" else None)(
        group_status(cluster, namespace, decode)), timeout=30, interval=0.05)
    took = time.monotonic() - diverged_at
    print(f"time to Desync through the operator: {took:.2f}s")
    # desyncAfter + two heartbeats, and a little for reading the status back through kubectl.
    assert took <= DESYNC_AFTER_S + 2 * HEARTBEAT_S + 0.5, took
    assert "rank 0 in recv_broadcast" in desync["message"]
    assert "rank 1 in kv_poll_all_reduce" in desync["message"]

    degraded = conditions(cluster, namespace)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "RankDesync")
    assert decode in degraded["message"]
    assert conditions(cluster, namespace)["Ready"]["status"] == "False"
    warning = wait_for("a GroupDesync event", lambda: events(cluster, namespace, "GroupDesync"), timeout=30)
    assert warning[0]["type"] == "Warning"
    assert decode in warning[0]["message"]
    assert "recv_broadcast" in warning[0]["message"] and "kv_poll_all_reduce" in warning[0]["message"]
    wait_for("the Desync gauge", lambda: operator.metric("pdfleet_engine_groups", role="decode",
                                                         verdict="Desync") >= 1, timeout=30)

    fleet[decode].progress()
    wait_for("the decode group Healthy again", lambda: group_status(cluster, namespace, decode).get("verdict")
             == "Healthy", timeout=30)
    recovered = wait_for("a GroupRecovered event", lambda: events(cluster, namespace, "GroupRecovered"), timeout=30)
    assert recovered[0]["type"] == "Normal"
    wait_for("Degraded=False", lambda: conditions(cluster, namespace)["Degraded"]["status"] == "False", timeout=30)
    assert len(events(cluster, namespace, "GroupDesync")) == 1


def test_a_desync_is_captured_as_evidence_then_the_group_is_restarted_as_a_unit(
        cluster: Cluster, operator: OperatorProcess, namespace: str, restarting_fleet: dict[str, FakeRanks]) -> None:
    decode = "tiny-decode-0"
    wait_for("the decode group Healthy", lambda: group_status(cluster, namespace, decode).get("verdict") == "Healthy",
             timeout=60)
    before = {p["metadata"]["uid"] for p in engine_pods(cluster, namespace)
              if p["metadata"]["labels"]["pdfleet.dev/group"] == decode}
    assert len(before) == 1

    diverged_at = time.monotonic()
    restarting_fleet[decode].hold(P.RECV_BROADCAST, P.KV_POLL_ALL_REDUCE)
    name = f"{decode}-evidence-1"
    cm = wait_for("the evidence ConfigMap", lambda: next(iter(cluster.get(
        "configmaps", "-n", namespace, "-l", f"pdfleet.dev/group={decode},pdfleet.dev/evidence=true")["items"]),
        None), timeout=30, interval=0.2)
    print(f"time to evidence: {time.monotonic() - diverged_at:.2f}s")
    assert cm["metadata"]["name"] == name
    assert cm["metadata"]["ownerReferences"][0]["kind"] == "InferencePool"
    assert cm["metadata"]["annotations"]["pdfleet.dev/evidence-verdict"] == "Desync"
    data = cm["data"]
    assert "verdict: Desync" in data["summary.txt"] and "agents that did not answer: none" in data["summary.txt"]
    [records] = [json.loads(v) for k, v in data.items() if k.endswith(".ranks.json")]
    assert sorted(r["rank"] for r in records["ranks"]) == [0, 1]
    assert "recv_broadcast" in json.dumps(records) and "kv_poll_all_reduce" in json.dumps(records)
    assert any(k.endswith(".stacks.json") for k in data)
    assert events(cluster, namespace, "EvidenceCaptured")[0]["message"].endswith(f"ConfigMap {name}")

    def replaced() -> bool:
        pods = [p for p in engine_pods(cluster, namespace) if p["metadata"]["labels"]["pdfleet.dev/group"] == decode]
        return len(pods) == 1 and pods[0]["metadata"]["uid"] not in before and ready_with_ip(pods[0])
    wait_for("the decode group's pods replaced", replaced, timeout=90, interval=0.2)
    print(f"time to a replaced group: {time.monotonic() - diverged_at:.2f}s")
    restarting_fleet[decode].progress()  # a new pod may reuse the old IP, and so this agent
    wait_for("status restarts == 1", lambda: group_status(cluster, namespace, decode).get("restarts") == 1,
             timeout=30)
    restarted = wait_for("a GroupRestarted event", lambda: events(cluster, namespace, "GroupRestarted"), timeout=30)
    assert restarted[0]["type"] == "Warning"
    message = restarted[0]["message"]
    assert message.startswith(f"restarting decode group {decode} as a unit: Desync (")
    assert "recv_broadcast" in message and message.endswith(f"evidence in ConfigMap {name}")
    wait_for("the restart counter", lambda: operator.metric("pdfleet_group_restarts_total", reason="Desync") >= 1,
             timeout=30)
    assert len(events(cluster, namespace, "GroupRestarted")) == 1
    assert group_status(cluster, namespace, decode)["restarts"] == 1
