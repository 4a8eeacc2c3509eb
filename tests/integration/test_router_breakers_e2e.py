"""End to end: one bad engine must not take a router down. Client load through both router replicas of a pool,
an engine that goes wrong in the middle of it, and what each router answers a client afterwards (every router
pod asked directly, Ready or not, a few times a second).

sglang-router 0.3.2 charges a failed PD request to both workers of its pair: requests paired with a hung decode
engine used to open the circuit breakers of healthy prefill engines, and a router then answered
`503 No available prefill workers` for a minute while the pool said Ready (docs/router.md).
"""

from __future__ import annotations

import time

import pytest

from tests.support import fleet, router_probe
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

POOL = "fleet"
MODEL = "qwen2.5-0.5b-instruct"
# How long a router may answer "no available workers" once the pool has its engines back: the operator's
# heartbeat (1 s here) and a router's own bookkeeping, not a breaker's minute.
RECOVERY_S = 5.0
WATCH_AFTER_S = 20.0  # how long after the recovery every router is watched


def _probe_routers(cluster: Cluster, namespace: str) -> list[tuple[str, str]]:
    port = fleet.pool(cluster, namespace, POOL)["spec"]["router"]["port"]
    return router_probe.pod_urls(fleet.router_pods(cluster, namespace, POOL), port)


def _watched_until(samples: list[router_probe.Sample], until: float, routers: int) -> bool:
    """Every one of `routers` routers has been asked at or after `until` (the window has been seen whole)."""
    return len({s.router for s in samples if s.at >= until}) >= routers


def _hang_a_decode_group_under_load(cluster: Cluster, namespace: str) -> tuple[list[router_probe.Sample], float,
                                                                              dict[str, object]]:
    """Load through both routers; decode-0 hangs and is restarted. Returns what every router answered, when the
    new decode group was Ready, and the client load's tally."""
    url = fleet.router_url(cluster, namespace, POOL, workers=4)
    victim = fleet.engine_pods(cluster, namespace, POOL, group=f"{POOL}-decode-0")[0]
    routers = len(fleet.router_pods(cluster, namespace, POOL))
    assert routers == 2
    with fleet.ready_routers(cluster, namespace, POOL) as endpoints, \
            fleet.steady_load(url, model=MODEL, rate=20, timeout_s=30, endpoints=lambda: endpoints) as load, \
            router_probe.sampling(lambda: _probe_routers(cluster, namespace)) as samples:
        wait_for("requests succeeding through both routers",
                 lambda: load.tally.ok >= 60 and len(load.used) == 2, timeout=90)
        fleet.inject(cluster, namespace, victim["metadata"]["name"], "hang")
        wait_for("the Hang verdict", lambda: fleet.events(cluster, namespace, POOL, "GroupHang"), timeout=60)

        def replaced() -> bool:
            pods = fleet.engine_pods(cluster, namespace, POOL, group=f"{POOL}-decode-0")
            return len(pods) == 1 and pods[0]["metadata"]["uid"] != victim["metadata"]["uid"] and \
                fleet.is_ready(pods[0])
        wait_for("the hung decode group replaced and Ready", replaced, timeout=120, interval=0.3)
        restored_at = time.monotonic()
        watched_until = restored_at + RECOVERY_S + WATCH_AFTER_S
        wait_for("every router watched after the restart", lambda: _watched_until(samples, watched_until, routers),
                 timeout=WATCH_AFTER_S + 60, interval=0.5)
    return list(samples), restored_at, load.tally.summary()


def test_a_decode_group_that_hangs_under_load_is_restarted_and_no_router_is_left_without_workers(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    """At the defaults (no circuit breakers in the routers: docs/router.md)."""
    fleet.apply_pool(cluster, namespace, POOL, health={"restartBudget": {"count": 3, "window": "1h"}})
    fleet.wait_ready(cluster, namespace, POOL)
    samples, restored_at, tally = _hang_a_decode_group_under_load(cluster, namespace)
    stuck = router_probe.longest_no_workers(samples, since=restored_at)
    print(f"client load: {tally}; longest no-workers 503 per router after the restart: {stuck}")
    assert max(stuck.values(), default=0.0) <= RECOVERY_S, (
        f"a router answered 'no available workers' for {stuck} s after the hung group was restarted",
        *fleet.event_lines(cluster, namespace))


def test_with_circuit_breakers_the_circuits_a_hung_group_opened_are_reset_by_the_operator(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    """Breakers on, and slow to close by themselves (10 minutes): the failures of the requests the hung decode
    engine held open the circuits of the healthy prefill engines they were paired with, in both routers. The
    operator resets them within seconds, says so, and the pool's status and metrics show both routers able to
    route again."""
    fleet.apply_pool(cluster, namespace, POOL, health={"restartBudget": {"count": 3, "window": "1h"}},
                     router={"circuitBreaker": {"enabled": True, "failureThreshold": 3, "openFor": "10m",
                                                "window": "2m"}})
    fleet.wait_ready(cluster, namespace, POOL)
    samples, restored_at, tally = _hang_a_decode_group_under_load(cluster, namespace)
    stuck = router_probe.longest_no_workers(samples, since=restored_at)
    resets = fleet.events(cluster, namespace, POOL, "RouterCircuitsReset")
    print(f"client load: {tally}; longest no-workers 503 per router after the restart: {stuck}; "
          f"resets: {[e['message'] for e in resets]}")
    assert resets and resets[0]["type"] == "Warning", ("no circuit was reset: did none open?",
                                                       *fleet.event_lines(cluster, namespace))
    assert "opened by failures that followed" in resets[0]["message"] or "no other" in resets[0]["message"]
    assert operator.metric("pdfleet_router_circuit_resets_total") >= 1
    assert max(stuck.values(), default=0.0) <= RECOVERY_S, (
        f"a router answered 'no available workers' for {stuck} s after the hung group was restarted",
        *fleet.event_lines(cluster, namespace))

    def both_route() -> list[dict] | None:
        routers = (fleet.pool(cluster, namespace, POOL).get("status") or {}).get("routers") or []
        return routers if len(routers) == 2 and all(
            r.get("availablePrefill") == 2 and r.get("availableDecode") == 2 for r in routers) else None
    listed = wait_for("both routers in the status with every worker available", both_route, timeout=30)
    for router in listed:
        for role in ("prefill", "decode"):
            assert operator.metric("pdfleet_router_available_workers", router=router["name"], role=role) == 2
