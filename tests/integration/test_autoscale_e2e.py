"""`spec.autoscaling` on the real control plane and the local fleet: long requests through the real router load
the one decode engine past its running-requests target, the operator scales decode to 2 groups, and once only a
light load is left it scales back to 1, without a failed or a hanging client request throughout (the group that
goes leaves the router's rotation and drains first). Its own operator, scoped to the test's namespace."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdfleet.podrunner import loadgen
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess, running_operator
from tests.support.pools import example

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
POOL = "autoscaled"
MODEL = example("local-fleet")["spec"]["model"]["servedName"]
LONG_TOKENS = 400  # about 4 s at the simulator's 10 ms per decode step
AUTOSCALING = {"decode": {"minReplicas": 1, "maxReplicas": 2, "targets": {"runningPerEngine": 2},
                          "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0},
                                       "scaleDown": {"stabilizationWindowSeconds": 20},
                                       "minIntervalSeconds": 10}}}


@pytest.fixture
def own_operator(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    cluster.wait_established("inferencepools.pdfleet.dev")
    with running_operator(cluster.kubeconfig, tmp_path / "operator.log", "--resync-period", "1",
                          "--namespace", namespace) as op:
        yield op
        assert "Traceback" not in op.logs(), op.logs()[-5000:]


@contextlib.contextmanager
def loads(*running: loadgen.Load) -> Iterator[None]:
    """The loads from a thread of their own, each stopped (its requests finished) on exit."""
    loop = asyncio.new_event_loop()

    async def all_of() -> None:
        await asyncio.gather(*(load.run() for load in running))
    thread = threading.Thread(target=lambda: loop.run_until_complete(all_of()), daemon=True)
    thread.start()
    try:
        yield
    finally:
        for load in running:
            loop.call_soon_threadsafe(load.stop)
        thread.join(timeout=60)


def _decode(cluster: Cluster, namespace: str, name: str = POOL) -> tuple[int, int, dict[str, Any]]:
    """The spec's decode replicas, the ready decode groups and status.autoscaling.decode."""
    pool = fleet.pool(cluster, namespace, name)
    status = pool.get("status") or {}
    return (pool["spec"]["decode"]["replicas"], int((status.get("decode") or {}).get("ready", 0)),
            (status.get("autoscaling") or {}).get("decode") or {})


@pytest.mark.effect("spec.autoscaling.decode.targets.runningPerEngine")
def test_a_loaded_decode_role_grows_and_shrinks_back_with_no_failed_request(
        cluster: Cluster, own_operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={"replicas": 1},
                     autoscaling=AUTOSCALING)
    fleet.wait_ready(cluster, namespace, POOL, timeout=240)
    url = fleet.router_url(cluster, namespace, POOL, workers=2)
    light = loadgen.Load(url, model=MODEL, concurrency=1, timeout_s=15)
    heavy = loadgen.Load(url, model=MODEL, concurrency=8, timeout_s=60, max_tokens=LONG_TOKENS)
    with loads(light):
        with loads(heavy):
            wait_for("decode scaled up to 2 groups, both ready",
                     lambda: _decode(cluster, namespace)[:2] == (2, 2), timeout=240, interval=0.5)
        up = [e["message"] for e in fleet.events(cluster, namespace, POOL, "ScaledUp")]
        assert any("decode 1 -> 2 (" in m and "running per engine" in m for m in up), up
        wait_for("decode scaled back to 1 group under the light load",
                 lambda: _decode(cluster, namespace)[:2] == (1, 1), timeout=240, interval=0.5)
        served = light.tally.ok
        wait_for("requests served after the scale-down", lambda: light.tally.ok >= served + 5, timeout=60)
    summary = (light.tally.summary(), heavy.tally.summary(), fleet.event_lines(cluster, namespace))
    assert light.tally.failed == 0 and heavy.tally.failed == 0, summary
    assert light.tally.in_flight == heavy.tally.in_flight == 0, summary
    down = [e["message"] for e in fleet.events(cluster, namespace, POOL, "ScaledDown")]
    assert any("decode 2 -> 1 (" in m for m in down), down
    status = _decode(cluster, namespace)[2]
    assert status.get("lastScaleTime") and status.get("desired") == 1, status
    assert own_operator.metric("pdfleet_autoscaler_decisions_total", role="decode", direction="down") >= 1


BANDED = "banded"


@pytest.mark.effect("spec.autoscaling.decode.maxReplicas")
def test_prefill_follows_the_autoscaled_decode_role_within_the_band_both_ways(
        cluster: Cluster, own_operator: OperatorProcess, namespace: str) -> None:
    """One decode group per prefill group (a band of exactly 1, Follow): the autoscaler's scale of decode carries
    prefill with it in the same write, up and back down, and the spec is never seen outside the band."""
    fleet.apply_pool(cluster, namespace, BANDED, prefill={"replicas": 1}, decode={"replicas": 1},
                     autoscaling=AUTOSCALING,
                     scaling={"ratio": {"minDecodePerPrefill": "1", "maxDecodePerPrefill": "1"}})
    fleet.wait_ready(cluster, namespace, BANDED, timeout=240)
    url = fleet.router_url(cluster, namespace, BANDED, workers=2)
    seen: list[tuple[int, int]] = []

    def sizes(prefill: int, decode: int) -> bool:
        pool = fleet.pool(cluster, namespace, BANDED)
        status = pool.get("status") or {}
        now = (pool["spec"]["prefill"]["replicas"], pool["spec"]["decode"]["replicas"])
        seen.append(now)
        assert now[0] == now[1], f"outside the band: prefill {now[0]}, decode {now[1]}"
        return now == (prefill, decode) and status.get("phase") == "Ready"

    heavy = loadgen.Load(url, model=MODEL, concurrency=8, timeout_s=60, max_tokens=LONG_TOKENS)
    light = loadgen.Load(url, model=MODEL, concurrency=1, timeout_s=15)
    with loads(light):
        with loads(heavy):
            wait_for("both roles at 2 groups, Ready", lambda: sizes(2, 2), timeout=300, interval=0.5)
        wait_for("both roles back at 1 group, Ready", lambda: sizes(1, 1), timeout=300, interval=0.5)
    assert (2, 2) in seen and light.tally.failed == heavy.tally.failed == 0, \
        (light.tally.summary(), heavy.tally.summary(), fleet.event_lines(cluster, namespace))
    assert light.tally.in_flight == heavy.tally.in_flight == 0
    up = [e["message"] for e in fleet.events(cluster, namespace, BANDED, "ScaledUp")]
    assert any(m.startswith("prefill 1 -> 2 (RatioFollow)") for m in up), up
    down = [e["message"] for e in fleet.events(cluster, namespace, BANDED, "ScaledDown")]
    assert any(m.startswith("prefill 2 -> 1 (RatioFollow)") for m in down), down
