"""Leader election end to end: two real operator processes, each with its own ServiceAccount (bound to the
chart's ClusterRole and Lease Role) so that the apiserver's audit log says who wrote what. Exactly one writes;
the other takes over when the leader is killed, when it stops gracefully, and when it loses the Lease."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.integration.test_operator_e2e import apply_pool, audit_writes_by, wait_pool_ready
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess, token_kubeconfig
from tests.support.release import OPERATOR_USER, RELEASE_NAMESPACE, SERVICE_ACCOUNT

pytestmark = pytest.mark.cluster

LEASE = "pdfleet"  # the chart's Lease: named after the release
OTHER_ACCOUNT = "pdfleet-second"
OTHER_USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{OTHER_ACCOUNT}"
FAILOVER_GOAL_S = 20.0  # lease duration 15s, plus a standby's retry and the new leader's start


@pytest.fixture(scope="module")
def second_account(cluster: Cluster, chart: None) -> Iterator[str]:
    """A second ServiceAccount with exactly the chart's grants, so the audit log tells the two operators apart."""
    cluster_role = f"pdfleet-{RELEASE_NAMESPACE}"  # the chart's: <fullname>-<release namespace>
    name = f"{OTHER_ACCOUNT}-{RELEASE_NAMESPACE}"
    remove_second_account(cluster, name)  # left over by an interrupted run
    cluster.kubectl("create", "serviceaccount", OTHER_ACCOUNT, "-n", RELEASE_NAMESPACE)
    cluster.kubectl("create", "clusterrolebinding", name, f"--clusterrole={cluster_role}",
                    f"--serviceaccount={RELEASE_NAMESPACE}:{OTHER_ACCOUNT}")
    cluster.kubectl("create", "rolebinding", OTHER_ACCOUNT, "-n", RELEASE_NAMESPACE,
                    "--role=pdfleet-leader-election", f"--serviceaccount={RELEASE_NAMESPACE}:{OTHER_ACCOUNT}")
    yield OTHER_ACCOUNT
    remove_second_account(cluster, name)


def remove_second_account(cluster: Cluster, cluster_binding: str) -> None:
    cluster.kubectl("delete", "clusterrolebinding", cluster_binding, "--ignore-not-found")
    cluster.kubectl("delete", "rolebinding,serviceaccount", OTHER_ACCOUNT, "-n", RELEASE_NAMESPACE,
                    "--ignore-not-found")


@pytest.fixture
def free_lease(cluster: Cluster, chart: None) -> Iterator[None]:
    """Each test starts with no Lease: its first operator creates it and leads."""
    cluster.kubectl("delete", "lease", LEASE, "-n", RELEASE_NAMESPACE, "--ignore-not-found")
    yield
    cluster.kubectl("delete", "lease", LEASE, "-n", RELEASE_NAMESPACE, "--ignore-not-found", check=False)


class Replicas:
    """Operator processes with --leader-elect, each named (POD_NAME) after the ServiceAccount it runs as."""

    def __init__(self, cluster: Cluster, namespace: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cluster, self.namespace, self.tmp, self.monkeypatch = cluster, namespace, tmp, monkeypatch
        self.started: list[OperatorProcess] = []

    def start(self, account: str) -> OperatorProcess:
        kubeconfig = token_kubeconfig(self.cluster, RELEASE_NAMESPACE, account, self.tmp / f"{account}.kubeconfig")
        self.monkeypatch.setenv("POD_NAME", account)
        op = OperatorProcess(kubeconfig, self.tmp / f"{account}-{len(self.started)}.log", "--namespace",
                             self.namespace, "--resync-period", "1", "--leader-elect",
                             f"--leader-elect-namespace={RELEASE_NAMESPACE}", f"--leader-elect-id={LEASE}")
        self.started.append(op)
        op.wait_ready()
        return op

    def stop_all(self) -> None:
        for op in self.started:
            op.stop()
        for op in self.started:
            assert "Traceback" not in op.logs(), op.logs()[-5000:]

    def lease(self) -> dict:
        return self.cluster.get("lease", LEASE, "-n", RELEASE_NAMESPACE)["spec"]

    def wait_leader(self, op: OperatorProcess, account: str, timeout: float = 60) -> float:
        """Waits until `op` leads (its metric, and the Lease names it); returns when that was seen."""
        wait_for(f"{account} to lead", lambda: op.metric("pdfleet_leader_is_leader") == 1 and
                 self.lease().get("holderIdentity", "").startswith(f"{account}_"), timeout=timeout, interval=0.1)
        return time.monotonic()


@pytest.fixture
def replicas(cluster: Cluster, namespace: str, second_account: str, free_lease: None, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Replicas]:
    group = Replicas(cluster, namespace, tmp_path, monkeypatch)
    try:
        yield group
    finally:
        group.stop_all()


def writes_in(cluster: Cluster, user: str, start: int, namespace: str) -> list[dict]:
    return [w for w in audit_writes_by(cluster, user, start) if f"/namespaces/{namespace}/" in w["uri"]]


def log_says(op: OperatorProcess, text: str) -> bool:
    return any(text in r.get("message", "") for r in op.log_records())


def test_exactly_one_operator_writes_and_the_standby_takes_over_from_a_killed_leader(
        cluster: Cluster, namespace: str, replicas: Replicas) -> None:
    if not cluster.is_local:
        pytest.skip("attributes writes with the local apiserver's audit log")
    leader = replicas.start(SERVICE_ACCOUNT)
    replicas.wait_leader(leader, SERVICE_ACCOUNT)
    standby = replicas.start(OTHER_ACCOUNT)
    start = cluster.audit_log.stat().st_size
    status, body = standby._get(standby.health_port, "/readyz")
    assert status == 200 and "standby" in body, body
    assert standby.metric("pdfleet_leader_is_leader") == 0

    apply_pool(cluster, namespace, name="ha", decode=1)
    wait_pool_ready(cluster, namespace, decode=1, name="ha")
    assert writes_in(cluster, OPERATOR_USER, start, namespace), "the leader reconciled the pool without writing?"
    assert audit_writes_by(cluster, OTHER_USER, start) == []  # the standby wrote nothing at all
    assert standby.metric("pdfleet_reconcile_total") == 0

    transitions = replicas.lease().get("leaseTransitions", 0)
    leader.proc.kill()  # SIGKILL: no release, the standby must wait the Lease out
    killed, killed_at = time.monotonic(), datetime.now(UTC)
    leader.proc.wait()
    cluster.kubectl("patch", "pdpool", "ha", "-n", namespace, "--type=merge",
                    "-p", '{"spec": {"decode": {"replicas": 2}}}')
    replicas.wait_leader(standby, OTHER_ACCOUNT, timeout=60)
    # When the standby took the Lease, by its own record (same machine, same clock): not when a poll saw it.
    took_over = (datetime.fromisoformat(replicas.lease()["acquireTime"]) - killed_at).total_seconds()
    wait_pool_ready(cluster, namespace, decode=2, name="ha")
    ready = time.monotonic() - killed
    print(f"\nfailover after SIGKILL: the standby took the Lease after {took_over:.1f}s (goal < "
          f"{FAILOVER_GOAL_S:g}s); the change made in the gap (a decode group more) was Ready after {ready:.1f}s")
    assert 0 < took_over < FAILOVER_GOAL_S
    assert replicas.lease()["leaseTransitions"] == transitions + 1
    assert standby.metric("pdfleet_leader_transitions_total", transition="acquired") == 1
    assert writes_in(cluster, OTHER_USER, start, namespace)
    assert log_says(standby, "became the leader")


def test_a_leader_stopped_gracefully_releases_the_lease_and_the_standby_takes_over_at_once(
        cluster: Cluster, replicas: Replicas) -> None:
    leader = replicas.start(SERVICE_ACCOUNT)
    replicas.wait_leader(leader, SERVICE_ACCOUNT)
    standby = replicas.start(OTHER_ACCOUNT)
    stopping = time.monotonic()
    assert leader.stop() == 0
    assert log_says(leader, "released the Lease")
    took_over = replicas.wait_leader(standby, OTHER_ACCOUNT, timeout=30)
    print(f"\nhand-over after SIGTERM: {took_over - stopping:.1f}s, the leader's shutdown included")
    # Not the lease duration: the released Lease is taken on the standby's next retry (2-2.4s).
    assert took_over - stopping < 5


def test_a_leader_that_cannot_renew_exits_before_anyone_else_leads(cluster: Cluster, replicas: Replicas) -> None:
    leader = replicas.start(OTHER_ACCOUNT)
    replicas.wait_leader(leader, OTHER_ACCOUNT)
    standby = replicas.start(SERVICE_ACCOUNT)
    # The leader's renewals are now refused (403), as when its API connection is gone.
    cluster.kubectl("delete", "rolebinding", OTHER_ACCOUNT, "-n", RELEASE_NAMESPACE)
    try:
        wait_for("the leader to exit", lambda: leader.proc.poll() is not None, timeout=30)
        exited = time.monotonic()
        assert leader.proc.returncode == 3
        (line,) = [r for r in leader.log_records() if r.get("message", "").startswith("lost leadership")]
        assert line["level"] == "critical" and "renew deadline" in line["message"], line
        took_over = replicas.wait_leader(standby, SERVICE_ACCOUNT, timeout=30)
        assert took_over > exited
        # The standby waited the Lease out after the leader's last renewal, which the leader outlived by less.
        assert log_says(standby, "became the leader")
    finally:
        cluster.kubectl("create", "rolebinding", OTHER_ACCOUNT, "-n", RELEASE_NAMESPACE,
                        "--role=pdfleet-leader-election", f"--serviceaccount={RELEASE_NAMESPACE}:{OTHER_ACCOUNT}",
                        check=False)
    print(json.dumps({"standby_led_after_leader_exit_s": round(took_over - exited, 1)}))
