"""`spec.autoscaling` wired as `handlers.startup` wires it (`operator.autoscaler`): the health poll reads each
autoscaled role's leader's /metrics (real HTTP on loopback, `FakeEngine` serving SGLang's text) through the
operator's one engine client, the decision is written into the pool's spec with the generation-guarded JSON Patch,
a `ScaledUp`/`ScaledDown` Event and `status.autoscaling` say why, and the metrics count it. The in-memory apiserver
stores what it is sent (`FakeKube`); its watch can lag (`watch_paused`)."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pdfleet.operator import handlers, metrics
from pdfleet.operator.autoscaler import STATUS_PAUSE, Autoscaler
from pdfleet.operator.controller import Controller
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.runtime_state import OperatorState, Options
from tests.support.fake_engines import FakeEngine
from tests.support.fake_fleet import DECODE, KEY, PREFILL, Fleet, engine_servers, rendered_fleet
from tests.unit.test_monitor_bake import baking, uid

NO_DAMPING = {"scaleUp": {"stabilizationWindowSeconds": 0}, "scaleDown": {"stabilizationWindowSeconds": 0},
              "minIntervalSeconds": 0}
DECODE_ON_KV = {"decode": {"maxReplicas": 4, "targets": {"kvCacheUsage": "0.5"}, "behavior": NO_DAMPING}}
LABELS = 'model_name="sim-model",engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0"'


def sglang_metrics(*, usage: float, running: int = 3, queue: int = 0) -> str:
    """The part of SGLang 0.5.23's /metrics a bake and the autoscaler read."""
    return "\n".join([
        "# HELP sglang:num_requests_total Number of requests processed.",
        "# TYPE sglang:num_requests_total counter",
        f'sglang:num_requests_total{{{LABELS},is_streaming="false"}} 10.0',
        "# TYPE sglang:num_running_reqs gauge", f"sglang:num_running_reqs{{{LABELS}}} {running}",
        "# TYPE sglang:num_queue_reqs gauge", f"sglang:num_queue_reqs{{{LABELS}}} {queue}",
        "# TYPE sglang:token_usage gauge", f"sglang:token_usage{{{LABELS}}} {usage}", ""])


class Clocks:
    def __init__(self) -> None:
        self.now = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)
        self.mono += seconds


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, FakeEngine]]:
    async with engine_servers(FakeEngine) as servers:
        yield servers


async def settle(fleet: Fleet) -> Controller:
    """The groups verified (their gates read from the engines), as the executor wired with the monitor's facts
    does it; returns that executor."""
    controller = Controller(client=fleet.kube, cache=fleet.kube.cache(), health=fleet.monitor.health,
                            engines=fleet.monitor.facts)
    await fleet.monitor.poll(KEY)
    await controller.reconcile(KEY)
    pool = fleet.kube.get("InferencePool", *KEY)
    assert pool is not None and all(g.get("verifiedRevision") for g in pool["status"]["groups"])
    return controller


def wire(fleet: Fleet, clocks: Clocks) -> Autoscaler:
    autoscaler = Autoscaler(client=fleet.kube, loads=fleet.monitor.loads, post_event=fleet.controller.post_event,
                            clock=lambda: clocks.now, monotonic=lambda: clocks.mono)
    membership = fleet.monitor.after_poll
    assert membership is not None

    async def both(key: Any, spec: Any, observed: Any, judged: dict[str, GroupHealth]) -> None:
        await membership(key, spec, observed, judged)
        await autoscaler.after_poll(key, spec, observed, judged)

    fleet.monitor.after_poll = both
    return autoscaler


def pool(fleet: Fleet) -> dict[str, Any]:
    found = fleet.kube.get("InferencePool", *KEY)
    assert found is not None
    return found


def metrics_reads(engine: FakeEngine) -> int:
    return sum(1 for method, path, _ in engine.requests if (method, path) == ("GET", "/metrics"))


def decisions(direction: str, rule: str) -> float:
    return metrics.REGISTRY.get_sample_value("pdfleet_autoscaler_decisions_total",
                                             {"role": "decode", "direction": direction, "rule": rule}) or 0.0


async def test_a_loaded_role_is_scaled_up_once_said_and_not_shrunk_while_its_new_group_starts(
        engines: dict[str, FakeEngine]) -> None:
    clocks = Clocks()
    async with rendered_fleet(engines, autoscaling=DECODE_ON_KV) as fleet:
        controller = await settle(fleet)
        wire(fleet, clocks)
        before = decisions("up", "KVCacheUsage")
        engines[DECODE].metrics = sglang_metrics(usage=0.9)
        fleet.kube.take_writes()
        await fleet.monitor.poll(KEY)

        # ceil(1 serving group * 0.9 / 0.5) = 2, written into the spec by a JSON Patch guarded by the generation
        assert pool(fleet)["spec"]["decode"]["replicas"] == 2
        [patch] = [w for w in fleet.kube.take_writes() if w.verb == "patch"]
        assert {"op": "test", "path": "/metadata/generation", "value": 1} in patch.body["ops"]  # type: ignore[index]
        [event] = fleet.events("ScaledUp")
        assert "decode 1 -> 2 (KVCacheUsage): KV cache usage 0.90 (target 0.50), over 1 serving group(s)" in \
            event["message"]
        status = pool(fleet)["status"]["autoscaling"]["decode"]
        assert (status["desired"], status["current"], status["rule"]) == (2, 1, "KVCacheUsage")
        assert status["lastScaleTime"] == "2026-11-30T12:00:00Z"
        assert decisions("up", "KVCacheUsage") == before + 1
        assert metrics.REGISTRY.get_sample_value("pdfleet_autoscaler_desired_groups",
                                                 {"namespace": "ns", "pool": "tiny", "role": "decode"}) == 2
        assert "autoscaling" not in pool(fleet)["status"] or "prefill" not in pool(fleet)["status"]["autoscaling"]

        # The watch has not shown the scale yet: the next poll decides nothing from the old replicas.
        with fleet.kube.watch_paused("InferencePool"):
            clocks.advance(5)
            await fleet.monitor.poll(KEY)
        assert pool(fleet)["spec"]["decode"]["replicas"] == 2
        assert not [w for w in fleet.kube.take_writes() if w.verb == "patch"]

        # The reconcile adds the group (not Ready yet); the load falls: no scale-down while it starts.
        await controller.reconcile(KEY)
        assert pool(fleet)["status"]["autoscaling"]["decode"]["desired"] == 2, "the planner carries it over"
        engines[DECODE].metrics = sglang_metrics(usage=0.05)
        clocks.advance(STATUS_PAUSE)
        await fleet.monitor.poll(KEY)
        assert pool(fleet)["spec"]["decode"]["replicas"] == 2
        status = pool(fleet)["status"]["autoscaling"]["decode"]
        assert status["rule"] == "NotAllServing" and "no scale-down" in status["message"]
        assert not fleet.events("ScaledDown")


async def test_a_steady_load_is_written_once_and_a_pool_without_autoscaling_reads_no_metrics(
        engines: dict[str, FakeEngine]) -> None:
    clocks = Clocks()
    async with rendered_fleet(engines, autoscaling=DECODE_ON_KV) as fleet:
        await settle(fleet)
        wire(fleet, clocks)
        fleet.kube.take_writes()
        for step in range(12):
            engines[DECODE].metrics = sglang_metrics(usage=0.5 + 0.02 * (step % 3 - 1))  # noise within 10%
            await fleet.monitor.poll(KEY)
            clocks.advance(STATUS_PAUSE)
        statuses = [w for w in fleet.kube.take_writes() if w.verb == "status" and w.kind == "InferencePool"]
        assert len(statuses) == 1, "the status says Tolerance once; the values alone change nothing"
        assert pool(fleet)["status"]["autoscaling"]["decode"]["rule"] == "Tolerance"
        assert pool(fleet)["spec"]["decode"]["replicas"] == 1
        assert metrics_reads(engines[DECODE]) >= 12 and metrics_reads(engines[PREFILL]) == 0, \
            "only the autoscaled role's leader is read"

        # Autoscaling switched off: its status goes, once.
        fleet.kube.update("InferencePool", *KEY, lambda p: p["spec"].pop("autoscaling"))
        await fleet.monitor.poll(KEY)
        await fleet.monitor.poll(KEY)
        assert "autoscaling" not in pool(fleet)["status"]
        assert len([w for w in fleet.kube.take_writes() if w.verb == "status"]) == 1

    async with engine_servers(FakeEngine) as plain, rendered_fleet(plain) as fleet:
        wire(fleet, clocks)
        await fleet.monitor.poll(KEY)
        await fleet.monitor.poll(KEY)
        assert [metrics_reads(plain[g]) for g in (PREFILL, DECODE)] == [0, 0]
        assert not [w for w in fleet.kube.take_writes() if w.verb == "patch"]



async def test_after_a_poll_each_step_runs_and_a_failing_one_does_not_stop_the_next() -> None:
    ran: list[str] = []

    async def membership(*_: Any) -> None:
        ran.append("membership")
        raise RuntimeError("a router did not answer")

    async def autoscaler(*_: Any) -> None:
        ran.append("autoscaler")

    await handlers._after_poll(membership, autoscaler)(KEY, None, None, {})  # type: ignore[arg-type]
    assert ran == ["membership", "autoscaler"]


async def test_a_bake_and_the_autoscaler_read_a_leaders_metrics_in_one_get(engines: dict[str, FakeEngine]) -> None:
    async with rendered_fleet(engines, autoscaling=DECODE_ON_KV) as fleet:
        engines[DECODE].metrics = sglang_metrics(usage=0.5)
        baking(fleet, DECODE, since_requests=4)
        before = metrics_reads(engines[DECODE])
        await fleet.monitor.poll(KEY)
        assert metrics_reads(engines[DECODE]) == before + 1
        assert fleet.monitor.facts(KEY)[DECODE].metrics[uid(fleet, DECODE)].requests == 10, "the bake's counters"
        assert fleet.monitor.loads(KEY)[DECODE].token_usage == 0.5, "and the autoscaler's load, from one answer"


async def test_a_role_no_longer_autoscaled_loses_its_status_and_the_other_keeps_its_own(
        engines: dict[str, FakeEngine]) -> None:
    clocks = Clocks()
    both = {**DECODE_ON_KV, "prefill": {"maxReplicas": 2, "targets": {"queuePerEngine": 4}, "behavior": NO_DAMPING}}
    async with rendered_fleet(engines, autoscaling=both) as fleet:
        await settle(fleet)
        wire(fleet, clocks)
        engines[DECODE].metrics = engines[PREFILL].metrics = sglang_metrics(usage=0.5, queue=4)
        await fleet.monitor.poll(KEY)
        assert set(pool(fleet)["status"]["autoscaling"]) == {"prefill", "decode"}
        fleet.kube.update("InferencePool", *KEY, lambda p: p["spec"]["autoscaling"].pop("prefill"))
        clocks.advance(STATUS_PAUSE)
        await fleet.monitor.poll(KEY)
        assert set(pool(fleet)["status"]["autoscaling"]) == {"decode"}
        assert pool(fleet)["status"]["autoscaling"]["decode"]["rule"] == "Tolerance"


async def test_the_echo_of_the_autoscalers_status_write_queues_no_reconcile_and_a_change_beside_it_does(
        engines: dict[str, FakeEngine]) -> None:
    """The planner only carries status.autoscaling over, so the pool's watch event of the autoscaler's own status
    write is no news: it queues no reconcile (each was one that wrote nothing). A write that landed on a pool changed
    since the poll read it (the patch is unguarded) carries that change: its event is reconciled."""
    clocks = Clocks()
    async with rendered_fleet(engines, autoscaling=DECODE_ON_KV) as fleet:
        await settle(fleet)
        autoscaler = wire(fleet, clocks)
        state = OperatorState(options=Options(owned_event_delay=0.0), controller=fleet.controller,
                              autoscaler=autoscaler)
        state.seen.add(KEY)
        memo: dict[str, Any] = {"state": state}
        engines[DECODE].metrics = sglang_metrics(usage=0.5)  # within tolerance: a status write, no scale
        fleet.kube.take_writes()
        await fleet.monitor.poll(KEY)
        assert len([w for w in fleet.kube.take_writes() if w.verb == "status"]) == 1
        assert pool(fleet)["status"]["autoscaling"]["decode"]["rule"] == "Tolerance"

        await handlers.pool_event({"type": "MODIFIED", "object": pool(fleet)}, memo)
        assert len(state.queue) == 0 and not state.queue._timers, "the echo of our own write queued a reconcile"

        # Someone labels the pool after the poll read it (its watch lags) and before the autoscaler's next write.
        engines[DECODE].metrics = sglang_metrics(usage=0.05)  # a new rule: written, no scale below minReplicas
        clocks.advance(STATUS_PAUSE)
        with fleet.kube.watch_paused("InferencePool"):
            fleet.kube.update("InferencePool", *KEY, lambda p: p["metadata"].setdefault("labels", {}).update(team="a"))
            await fleet.monitor.poll(KEY)
        assert len([w for w in fleet.kube.take_writes() if w.verb == "status"]) == 1
        assert pool(fleet)["spec"]["decode"]["replicas"] == 1
        assert pool(fleet)["status"]["autoscaling"]["decode"]["rule"] != "Tolerance"
        await handlers.pool_event({"type": "MODIFIED", "object": pool(fleet)}, memo)
        assert len(state.queue) == 1, "a change beside the autoscaler's write is news"
        state.queue.close()
