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

from pdfleet.operator.render.router_objects import METRICS_PORT
from pdfleet.runtime import router_ready
from tests.support import fleet, router_probe
from tests.support.cluster import Cluster, WaitTimeout, wait_for
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


def _available(operator: OperatorProcess, router: str, role: str) -> float | None:
    """pdfleet_router_available_workers for one router and role; None while the operator exports none."""
    for line in operator.metrics().splitlines():
        if line.startswith("pdfleet_router_available_workers{") and f'router="{router}"' in line and \
                f'role="{role}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def _routers_seen(cluster: Cluster, namespace: str) -> list[str]:
    """What each router pod says of itself: Ready, its workers (healthy in its checks) and their circuits; for a
    failure's message."""
    lines = []
    port = fleet.pool(cluster, namespace, POOL)["spec"]["router"]["port"]
    for pod in fleet.router_pods(cluster, namespace, POOL):
        ip = pod["status"].get("podIP")
        listed = fleet.workers(f"http://{ip}:{port}", fleet.router_key(cluster, namespace, POOL, pod)) or []
        _, metrics = fleet.http_get(f"http://{ip}:{METRICS_PORT}/metrics")
        states = router_ready.circuit_states(metrics)
        lines.append(f"{pod['metadata']['name']} Ready={fleet.is_ready(pod)}: " + ", ".join(
            f"{w.get('worker_type')} {w.get('url')} healthy={w.get('is_healthy')} circuit={states.get(w.get('url'))}"
            for w in listed))
    return lines


def _status_routers(cluster: Cluster, namespace: str) -> dict[str, dict]:
    routers = (fleet.pool(cluster, namespace, POOL).get("status") or {}).get("routers") or []
    return {r["name"]: r for r in routers}


def test_a_router_with_every_circuit_open_goes_not_ready_and_is_said_so_until_the_operator_brings_it_back(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    """Breakers on. Every engine answers every request with a 500 while its health checks pass (the simulator's
    `failing` fault, at share 1): every circuit opens in both routers. A router then goes not Ready (its readiness
    sidecar: it cannot route), and meanwhile the pool's status and the operator's gauge show it with no prefill
    worker available. The operator resets the circuits of engines it judges healthy, ever more rarely while they
    open again at once (not at every poll); once the engines answer again, its next reset brings each router back:
    Ready, a worker of each role available, said in the status and the gauge. (A circuit that opened again just
    before the engines healed, on a router that has other workers of its role, is left to the router.)"""
    fleet.apply_pool(cluster, namespace, POOL, router={"circuitBreaker": {
        "enabled": True, "failureThreshold": 3, "openFor": "10m", "window": "2m"}})
    fleet.wait_ready(cluster, namespace, POOL)
    engines = [p["metadata"]["name"] for p in fleet.engine_pods(cluster, namespace, POOL)]
    url = fleet.router_url(cluster, namespace, POOL, workers=4)
    with fleet.ready_routers(cluster, namespace, POOL) as endpoints, \
            fleet.steady_load(url, model=MODEL, rate=10, timeout_s=10, endpoints=lambda: list(endpoints)) as load:
        wait_for("requests succeeding", lambda: load.tally.ok >= 20, timeout=60)
        # What the pool's status and the operator's gauge say of each router, sampled all along: while the circuits
        # open, are reset and open again, each state lasts only seconds.
        said: list[dict] = []
        gauged: list[float | None] = []

        def look() -> None:
            said.append(_status_routers(cluster, namespace))
            gauged.extend(_available(operator, p["metadata"]["name"], "prefill")
                          for p in fleet.router_pods(cluster, namespace, POOL))

        def not_ready() -> list[str] | None:
            return [p["metadata"]["name"] for p in fleet.router_pods(cluster, namespace, POOL)
                    if not fleet.is_ready(p)] or None

        failing_since = time.monotonic()
        with fleet.every(0.3, look):
            for pod in engines:
                fleet.inject(cluster, namespace, pod, "failing", fail_share="1")
            wait_for("a router not Ready", not_ready, timeout=90, interval=0.3)
            wait_for("the pool's status: a router with no prefill worker available", lambda: [
                r for seen in said for r in seen.values() if r.get("availablePrefill") == 0], timeout=60)
            wait_for("the gauge: a router with no prefill worker available", lambda: 0 in gauged, timeout=60)
        assert any(r.get("openCircuits") or r.get("missingWorkers") for seen in said for r in seen.values()), \
            said[-5:]

        for pod in engines:
            cluster.kubectl("annotate", "pod", pod, "-n", namespace, f"{fleet.FAULT}-", "sim.pdfleet.dev/fail-share-")
        failing_for = time.monotonic() - failing_since

        def every_router_back() -> bool:
            pods = fleet.router_pods(cluster, namespace, POOL)
            routers = _status_routers(cluster, namespace)
            return len(pods) == 2 and all(fleet.is_ready(p) for p in pods) and len(routers) == 2 and all(
                r.get("availablePrefill", 0) >= 1 and r.get("availableDecode", 0) >= 1 for r in routers.values())
        try:
            wait_for("every router Ready and able to reach a worker of each role", every_router_back, timeout=120,
                     interval=0.5)
        except WaitTimeout as e:
            raise AssertionError("\n".join([str(e), f"status.routers: {_status_routers(cluster, namespace)}",
                                            *_routers_seen(cluster, namespace),
                                            *fleet.event_lines(cluster, namespace)])) from None
        back_in = time.monotonic() - failing_since - failing_for
    # A circuit still open on a router that has other workers of its role is the router's to close (openFor).
    for pod in fleet.router_pods(cluster, namespace, POOL):
        for role in ("prefill", "decode"):
            assert (_available(operator, pod["metadata"]["name"], role) or 0) >= 1
    resets = fleet.events(cluster, namespace, POOL, "RouterCircuitsReset")
    assert any("no other prefill worker was available" in e["message"] for e in resets), \
        [e["message"] for e in resets]
    # Backing off: per worker on each router, resets at 0, 5, 15, 35, 75... s into its failure, not one a second.
    # A router's workers (every engine of the pool) back off apart: one whose circuit opened a poll later than the
    # others' is reset in a round of its own, so a router may post one reset Event per worker per round.
    rounds = sum(1 for at in (0, 5, 15, 35, 75, 135, 195, 255) if at <= failing_for + back_in) + 1
    print(f"failing for {failing_for:.0f} s, every router back {back_in:.0f} s after; {len(resets)} reset Events; "
          f"client load: {load.tally.summary()}")
    routers, workers_per_router = 2, len(engines)
    assert sum(e.get("count", 1) for e in resets) <= routers * workers_per_router * rounds, \
        [e["message"] for e in resets]
