"""`spec.autoscaling`'s decision (`planning.scale.autoscale`), pure: the HPA's rule per target and over targets, the
tolerance band, stabilisation over the recommendation history, step limits, bounds, the minimum interval, no
scale-down while a role is not all serving, the ratio band; and time walked forward through a load that
oscillates, closed loop (each decision changes the next poll's load per engine), flapping no more than the windows
allow."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import random
from typing import Any

import pytest

from pdfleet.operator.api.autoscaling import (
    MAX_RECOMMENDATIONS,
    AutoscalingRoleStatus,
    DecodeAutoscaling,
    PrefillAutoscaling,
    Recommendation,
)
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.scaling import OnScale, RatioBand
from pdfleet.operator.planning.scale import autoscale
from pdfleet.operator.planning.scale.autoscale import Decision, RoleInput, Rule
from pdfleet.operator.planning.scale.engine_load import EngineLoad

P, D = Role.PREFILL, Role.DECODE
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def decode(**targets: Any) -> DecodeAutoscaling:
    behavior = targets.pop("behavior", {})
    bounds = {"min_replicas": targets.pop("min", 1), "max_replicas": targets.pop("max", 10)}
    return DecodeAutoscaling.model_validate({**bounds, "targets": targets or {"kv_cache_usage": "0.5"},
                                             "behavior": behavior})


def prefill(**targets: Any) -> PrefillAutoscaling:
    behavior = targets.pop("behavior", {})
    bounds = {"min_replicas": targets.pop("min", 1), "max_replicas": targets.pop("max", 10)}
    return PrefillAutoscaling.model_validate({**bounds, "targets": targets or {"queue_per_engine": 4},
                                              "behavior": behavior})


NO_DAMPING = {"scale_up": {"stabilization_window_seconds": 0, "max_groups": 100},
              "scale_down": {"stabilization_window_seconds": 0, "max_groups": 100}, "min_interval_seconds": 0}


def given(scaling: Any, replicas: int, loads: list[EngineLoad] | None = None, *, serving: int | None = None,
          all_serving: bool = True, status: AutoscalingRoleStatus | None = None) -> RoleInput:
    loads = [EngineLoad()] * replicas if loads is None else loads
    return RoleInput(replicas=replicas, serving=len(loads) if serving is None else serving, all_serving=all_serving,
                     loads=tuple(loads), scaling=scaling, status=status)


def one(scaling: Any, replicas: int, loads: list[EngineLoad], now: datetime.datetime = T0, *,
        band: RatioBand | None = None, other: int = 1, **kwargs: Any) -> Decision:
    role = D if isinstance(scaling, DecodeAutoscaling) else P
    inputs = {role: given(scaling, replicas, loads, **kwargs),
              (P if role is D else D): RoleInput(replicas=other, serving=other, all_serving=True)}
    return autoscale.decide(inputs, band, now)[role]


def kv(usage: float) -> EngineLoad:
    return EngineLoad(token_usage=usage)


# ---- the HPA's rule -----------------------------------------------------------------------------------------

@pytest.mark.effect("spec.autoscaling.*.targets.kvCacheUsage")
@pytest.mark.parametrize(("replicas", "usages", "target", "desired", "rule"), [
    pytest.param(2, [0.9, 0.9], "0.5", 4, Rule.KV_CACHE, id="ceil(2 * 0.9 / 0.5) = 4"),
    pytest.param(2, [0.54, 0.54], "0.5", 2, Rule.TOLERANCE, id="8% over the target: within tolerance"),
    pytest.param(2, [0.45, 0.46], "0.5", 2, Rule.TOLERANCE, id="9% under: within tolerance"),
    pytest.param(4, [0.1, 0.1, 0.1, 0.1], "0.5", 1, Rule.KV_CACHE, id="ceil(4 * 0.1 / 0.5) = 1"),
    pytest.param(3, [0.3, 0.3, 0.3], "0.3", 3, Rule.TOLERANCE, id="exactly at the target"),
    pytest.param(10, [0.33] * 10, "0.3", 10, Rule.TOLERANCE, id="10% over: still within (no ulp off)"),
])
def test_the_hpa_rule_on_kv_cache_usage(replicas: int, usages: list[float], target: str, desired: int,
                                        rule: str) -> None:
    for scaling in (decode(kv_cache_usage=target, behavior=NO_DAMPING),
                    prefill(kv_cache_usage=target, behavior=NO_DAMPING)):
        d = one(scaling, replicas, [kv(u) for u in usages])
        assert (d.desired, d.rule) == (desired, rule)


@pytest.mark.effect("spec.autoscaling.*.targets.queuePerEngine", "spec.autoscaling.*.targets.runningPerEngine")
def test_the_most_exceeded_target_sizes_the_role() -> None:
    loads = [EngineLoad(queue=12, running=10), EngineLoad(queue=4, running=10)]  # queue 8 per engine, running 10
    d = one(prefill(queue_per_engine=4, running_per_engine=8, behavior=NO_DAMPING), 2, loads)
    assert (d.desired, d.rule) == (4, Rule.QUEUE)  # queue: ceil(2 * 8 / 4) = 4; running: ceil(2 * 10 / 8) = 3
    assert "queue per engine 8.0 (target 4.0)" in d.message and "running per engine 10.0" in d.message
    d = one(decode(running_per_engine=4, queue_per_engine=100, behavior=NO_DAMPING), 2, loads)
    assert (d.desired, d.rule) == (5, Rule.RUNNING)


@pytest.mark.effect("spec.autoscaling.prefill.targets.timeToFirstTokenMilliseconds")
def test_time_to_first_token_is_the_window_mean_over_requests() -> None:
    # 30 requests at 0.9 s and 10 at 0.1 s in the window: 0.7 s mean, not the engines' mean of means (0.5 s).
    loads = [EngineLoad(ttft_sum=27.0, ttft_count=30), EngineLoad(ttft_sum=1.0, ttft_count=10)]
    d = one(prefill(time_to_first_token_milliseconds=350, behavior=NO_DAMPING), 2, loads)
    assert (d.desired, d.rule) == (4, Rule.TTFT)
    assert "time to first token 700 ms (target 350 ms)" in d.message
    # No request finished in the window while some run or wait (a stall, or long prompts): that says nothing.
    busy = one(prefill(time_to_first_token_milliseconds=350, behavior=NO_DAMPING), 2,
               [EngineLoad(running=1), EngineLoad(queue=2)])
    assert (busy.desired, busy.rule) == (2, Rule.NO_METRICS)


@pytest.mark.effect("spec.autoscaling.prefill.targets.timeToFirstTokenMilliseconds",
                    "spec.autoscaling.decode.targets.interTokenLatencyMilliseconds")
def test_a_role_sized_on_latency_alone_shrinks_once_its_engines_are_idle() -> None:
    """With no request finished, queued or running on any serving engine, the latency reads as 0: the role goes
    down to minReplicas instead of keeping its peak size for as long as no traffic comes."""
    idle = one(prefill(time_to_first_token_milliseconds=350, behavior=NO_DAMPING), 2, [EngineLoad()] * 2)
    assert (idle.desired, idle.rule) == (1, Rule.MIN_REPLICAS), idle.message
    assert "time to first token 0 ms (target 350 ms) (idle" in idle.message
    idle = one(decode(inter_token_latency_milliseconds=20, behavior=NO_DAMPING), 3, [EngineLoad()] * 3)
    assert (idle.desired, idle.rule) == (1, Rule.MIN_REPLICAS), idle.message
    assert idle.message.endswith("recommends 0; held at minReplicas 1"), "why it is not 0 is said with it"


@pytest.mark.effect("spec.autoscaling.decode.targets.interTokenLatencyMilliseconds")
def test_inter_token_latency_on_decode() -> None:
    loads = [EngineLoad(itl_sum=0.06 * 500, itl_count=500)] * 3
    d = one(decode(inter_token_latency_milliseconds=20, behavior=NO_DAMPING), 3, loads)
    assert (d.desired, d.rule) == (9, Rule.ITL)


def test_no_load_read_changes_nothing() -> None:
    d = one(decode(behavior=NO_DAMPING), 3, [])
    assert (d.desired, d.rule, d.recommendation) == (3, Rule.NO_METRICS, None)


# ---- bounds, steps, interval --------------------------------------------------------------------------------

@pytest.mark.effect("spec.autoscaling.*.minReplicas", "spec.autoscaling.*.maxReplicas")
def test_bounds_hold_with_load_and_without() -> None:
    assert (one(decode(max=3, behavior=NO_DAMPING), 2, [kv(1.0)] * 2).desired) == 3
    assert one(decode(max=3, behavior=NO_DAMPING), 2, [kv(1.0)] * 2).rule == Rule.MAX_REPLICAS
    low = one(decode(min=2, behavior=NO_DAMPING), 4, [kv(0.01)] * 4)
    assert (low.desired, low.rule) == (2, Rule.MIN_REPLICAS)
    # A role below its minimum (a person's edit) is brought up though no engine answered.
    below = one(prefill(min=3, behavior=NO_DAMPING), 1, [])
    assert (below.desired, below.rule) == (3, Rule.MIN_REPLICAS)


@pytest.mark.effect("spec.autoscaling.*.behavior.scaleUp.maxGroups", "spec.autoscaling.*.behavior.scaleDown.maxGroups")
def test_step_limits_and_their_defaults() -> None:
    damped = {"scale_up": {"stabilization_window_seconds": 0}, "scale_down": {"stabilization_window_seconds": 0},
              "min_interval_seconds": 0}
    up = one(decode(behavior=damped), 2, [kv(1.0)] * 2)  # recommends 4; default step up 2
    assert (up.desired, up.rule) == (4, Rule.KV_CACHE)
    up = one(decode(behavior=damped, max=20), 2, [kv(2.5)] * 2)  # recommends 10
    assert (up.desired, up.rule) == (4, Rule.STEP_LIMIT)
    down = one(decode(behavior=damped), 6, [kv(0.01)] * 6)  # recommends 1; default step down 1
    assert (down.desired, down.rule) == (5, Rule.STEP_LIMIT)
    wide = {**damped, "scale_up": {"stabilization_window_seconds": 0, "max_groups": 5},
            "scale_down": {"stabilization_window_seconds": 0, "max_groups": 3}}
    assert one(decode(behavior=wide, max=20), 2, [kv(2.5)] * 2).desired == 7
    assert one(decode(behavior=wide), 6, [kv(0.01)] * 6).desired == 3


@pytest.mark.effect("spec.autoscaling.*.behavior.minIntervalSeconds")
def test_no_scale_within_the_minimum_interval_of_the_last() -> None:
    behavior = {**NO_DAMPING, "min_interval_seconds": 120}
    last = AutoscalingRoleStatus(desired=2, current=2, last_scale_time=T0)
    held = one(decode(behavior=behavior), 2, [kv(1.0)] * 2, T0 + datetime.timedelta(seconds=119), status=last)
    assert (held.desired, held.rule) == (2, Rule.MIN_INTERVAL)
    assert "minIntervalSeconds 120" in held.message
    taken = one(decode(behavior=behavior), 2, [kv(1.0)] * 2, T0 + datetime.timedelta(seconds=120), status=last)
    assert taken.desired == 4
    assert one(decode(), 2, [kv(1.0)] * 2, T0 + datetime.timedelta(seconds=59),  # the default: 60 s
               status=last.model_copy(update={"recommendations": (Recommendation(time=T0, replicas=4),)})
               ).rule == Rule.MIN_INTERVAL


# ---- safety -------------------------------------------------------------------------------------------------

def test_no_scale_down_while_the_role_is_not_all_serving_but_a_scale_up_goes() -> None:
    held = one(decode(behavior=NO_DAMPING), 4, [kv(0.05)] * 3, all_serving=False)
    assert (held.desired, held.rule) == (4, Rule.NOT_ALL_SERVING)
    assert "no scale-down" in held.message
    # 2 of 4 serve, loaded: ceil(2 * 1.0 / 0.5) = 4 is no more than there are: nothing
    assert one(decode(behavior=NO_DAMPING), 4, [kv(1.0)] * 2, all_serving=False).desired == 4
    assert one(decode(behavior=NO_DAMPING), 4, [kv(1.5)] * 2, all_serving=False).desired == 6


def test_capacity_counts_the_serving_groups_not_the_spec() -> None:
    # 3 groups asked for, 1 serves (say the others restart): the one that serves is what the load is over.
    d = one(decode(behavior=NO_DAMPING), 3, [kv(2.0)], all_serving=False)
    assert d.desired == 4 and "over 1 serving group(s)" in d.message


# ---- stabilisation ------------------------------------------------------------------------------------------

def walk(scaling: Any, replicas: int, load: list[float], *, seconds: int = 5,
         all_serving: bool = True) -> list[tuple[int, int, str]]:
    """Polls every `seconds` with the given per-engine usage, the role's size changed by each decision and the
    status carried: (seconds since start, desired, rule) at every poll."""
    status: AutoscalingRoleStatus | None = None
    out = []
    for step, usage in enumerate(load):
        now = T0 + datetime.timedelta(seconds=step * seconds)
        d = one(scaling, replicas, [kv(usage)] * replicas, now, status=status, all_serving=all_serving)
        assert d.status is not None
        status = d.status if d.desired == replicas else autoscale.scaled(d.status, now)
        replicas = d.desired
        out.append((step * seconds, d.desired, d.rule))
    return out


@pytest.mark.effect("spec.autoscaling.*.behavior.scaleUp.stabilizationWindowSeconds")
def test_a_burst_shorter_than_the_up_window_does_nothing_a_sustained_one_scales() -> None:
    scaling = decode(behavior={"scale_up": {"stabilization_window_seconds": 30}, "min_interval_seconds": 0})
    burst = walk(scaling, 2, [0.5] * 4 + [1.0] * 5 + [0.5] * 10)  # 25 s of double load
    assert {desired for _, desired, _ in burst} == {2}
    assert any(rule == Rule.STABILIZED_UP for _, _, rule in burst)
    sustained = walk(scaling, 2, [0.5] * 4 + [1.0] * 10)
    first = next(t for t, desired, _ in sustained if desired > 2)
    assert first == 20 + 30  # the load doubled at 20 s; the window's smallest recommendation is 4 from 50 s


@pytest.mark.effect("spec.autoscaling.*.behavior.scaleDown.stabilizationWindowSeconds")
def test_a_scale_down_waits_for_the_down_window_of_lower_recommendations() -> None:
    scaling = decode(behavior={"scale_down": {"stabilization_window_seconds": 120}, "min_interval_seconds": 0})
    # 4 groups at 0.5 (on target), then at 0.1: recommends 1, and the default step takes one group at a time.
    seen = walk(scaling, 4, [0.5] * 6 + [0.1] * 60)
    first = next(t for t, desired, _ in seen if desired < 4)
    assert first == 30 + 120
    assert all(rule == Rule.STABILIZED_DOWN for t, desired, rule in seen if 30 <= t < 150)
    # then one group per decision (the step), the rest of the way to 1
    assert [d for _, d, _ in seen][-1] == 1
    default = walk(decode(behavior={"min_interval_seconds": 0}), 4, [0.5] * 6 + [0.1] * 70)
    assert next(t for t, desired, _ in default if desired < 4) == 30 + 300


def test_history_keeps_change_points_only_and_the_entry_in_effect_at_the_window_start() -> None:
    minute = datetime.timedelta(minutes=1)
    history: tuple[Recommendation, ...] = ()
    for i, value in enumerate([3, 3, 3, 5, 5, 2, 2, 2, 2, 2]):
        history = autoscale.remember(history, value, T0 + i * minute, keep=3 * minute)
    assert [(r.time, r.replicas) for r in history] == [(T0 + 5 * minute, 2)]
    history = autoscale.remember((), 3, T0, keep=3 * minute)
    history = autoscale.remember(history, 5, T0 + 3 * minute, keep=3 * minute)
    history = autoscale.remember(history, 2, T0 + 5 * minute, keep=3 * minute)
    # at 5 min, the 3-min window began at 2 min, when 3 was in effect
    assert autoscale.in_window(history, T0 + 5 * minute, 180) == [5, 2, 3]
    assert autoscale.in_window(history, T0 + 5 * minute, 0) == [2]


def test_a_history_at_its_cap_keeps_the_largest_of_what_it_folds() -> None:
    second = datetime.timedelta(seconds=1)
    history: tuple[Recommendation, ...] = ()
    values = [9, *([1, 2] * 20)]  # 41 changes within the window: more than the status keeps
    for i, value in enumerate(values):
        history = autoscale.remember(history, value, T0 + i * second, keep=300 * second)
    assert len(history) == MAX_RECOMMENDATIONS
    assert history[0].time == T0 and history[0].replicas == 9, "the peak is still in the down window"
    assert max(autoscale.in_window(history, T0 + 40 * second, 300)) == 9
    assert [r.replicas for r in history[-4:]] == [1, 2, 1, 2], "the recent changes are as they were"


def test_an_oscillating_load_flaps_no_more_than_the_windows_allow() -> None:
    """Demand alternates every 2 minutes between 4 and 1.2 engines' worth of KV (target 0.5 per engine), for an
    hour, closed loop: the usage per engine is the demand over the groups serving it. With the defaults (up 30 s,
    down 300 s, min interval 60 s) the role grows to the peak once and never shrinks: each low phase is shorter
    than the down window."""
    scaling = decode()
    replicas, status = 2, None
    sizes = []
    for step in range(3600 // 5):
        now = T0 + datetime.timedelta(seconds=step * 5)
        demand = 4.0 if (step * 5 // 120) % 2 == 0 else 1.2
        d = one(scaling, replicas, [kv(demand / replicas)] * replicas, now, status=status)
        assert d.status is not None
        status = d.status if d.desired == replicas else autoscale.scaled(d.status, now)
        replicas = d.desired
        sizes.append(replicas)
    changes = [(i * 5, a, b) for i, (a, b) in enumerate(itertools.pairwise(sizes), 1) if a != b]
    assert all(b > a for _, a, b in changes), changes
    assert sizes[-1] == 8 and len(changes) <= 3


@pytest.mark.parametrize(("up", "down", "interval"), [(0, 5, 0), (3, 20, 10), (30, 300, 60)])
@pytest.mark.parametrize("seed", range(4))
def test_any_load_flaps_no_more_than_the_windows_and_the_interval_allow(up: int, down: int, interval: int,
                                                                          seed: int) -> None:
    """Demand as a random square wave (levels of 0.2 to 6 engines' worth of KV, each held 1 s to twice the down
    window), polled every second for 40 minutes, closed loop. Every decision is checked against the
    recommendations it had, whatever the sequence: a scale-up only to the smallest recommendation of the up
    window, a scale-down only to the largest of the down window, two scales at least minIntervalSeconds apart.
    So a scale-down follows a scale-up by at least the down window (the flap bound: at most one reversal per
    down window), and the size changes at most once per interval."""
    rng = random.Random(seed)
    scaling = decode(max=8, behavior={"scale_up": {"stabilization_window_seconds": up},
                                      "scale_down": {"stabilization_window_seconds": down},
                                      "min_interval_seconds": interval})
    seconds = 2400
    demand: list[float] = []
    while len(demand) < seconds:
        demand += [rng.choice([0.2, 0.9, 1.5, 2.4, 4.0, 6.0])] * rng.randint(1, 2 * down + 1)
    replicas, status = 2, None
    recommended: list[int | None] = []
    scales: list[tuple[int, int, int]] = []  # (second, before, after)
    for t in range(seconds):
        now = T0 + datetime.timedelta(seconds=t)
        d = one(scaling, replicas, [kv(demand[t] * 0.5 / replicas)] * replicas, now, status=status)
        assert d.status is not None
        recommended.append(d.recommendation)
        if d.desired != replicas:
            scales.append((t, replicas, d.desired))
        status = d.status if d.desired == replicas else autoscale.scaled(d.status, now)
        replicas = d.desired

    def seen(t: int, window: int) -> list[int]:  # the recommendations made in (t - window, t], or at t alone
        return [r for r in recommended[max(0, t - max(window, 1) + 1):t + 1] if r is not None]
    for t, before, after in scales:
        if after > before:
            assert min(seen(t, up)) >= after, (t, before, after, seen(t, up))
        else:
            assert max(seen(t, down)) <= after, (t, before, after, seen(t, down))
    assert all(b[0] - a[0] >= interval for a, b in itertools.pairwise(scales)), scales
    reversals = [(a, b) for a, b in itertools.pairwise(scales) if a[2] > a[1] and b[2] < b[1]]
    assert all(b[0] - a[0] >= down for a, b in reversals), reversals
    assert len(scales) <= seconds // max(interval, 1) + 1
    assert len(reversals) <= seconds // down + 1
    assert any(after > before for _, before, after in scales) and any(after < before for _, before, after in scales)


def test_a_load_that_stays_low_longer_than_the_down_window_scales_down_once_per_interval() -> None:
    scaling = decode(behavior={"scale_down": {"stabilization_window_seconds": 300}})
    seen = walk(scaling, 6, [0.05] * 200)
    downs = [t for (_, a, _), (t, b, _) in zip([(0, 6, ""), *seen], seen, strict=False) if b < a]
    assert downs[0] >= 300
    assert all(later - earlier >= 60 for earlier, later in itertools.pairwise(downs))


# ---- the ratio band -----------------------------------------------------------------------------------------

def band(on_scale: OnScale = OnScale.FOLLOW) -> RatioBand:
    return RatioBand(min_decode_per_prefill="1", max_decode_per_prefill="2", on_scale=on_scale)


def test_follow_moves_the_other_role_and_says_so() -> None:
    inputs = {D: given(decode(behavior=NO_DAMPING), 2, [kv(1.0)] * 2),
              P: RoleInput(replicas=1, serving=1, all_serving=True)}
    out = autoscale.decide(inputs, band(), T0)
    assert (out[D].desired, out[D].rule) == (4, Rule.KV_CACHE)
    assert (out[P].desired, out[P].rule) == (2, Rule.RATIO_FOLLOW)
    assert "prefill follows decode to 2" in out[P].message


def test_clamp_cuts_the_autoscaled_role() -> None:
    inputs = {D: given(decode(behavior=NO_DAMPING), 2, [kv(1.0)] * 2),
              P: RoleInput(replicas=1, serving=1, all_serving=True)}
    out = autoscale.decide(inputs, band(OnScale.CLAMP), T0)
    assert (out[D].desired, out[D].rule) == (2, Rule.RATIO_CLAMP) and P not in out
    assert out[D].status is not None and out[D].status.rule == Rule.RATIO_CLAMP


def test_both_roles_scaled_at_once_decode_leads_and_the_band_holds() -> None:
    inputs = {D: given(decode(behavior=NO_DAMPING), 2, [kv(1.0)] * 2),
              P: given(prefill(behavior=NO_DAMPING), 2, [EngineLoad(queue=1)] * 2)}
    out = autoscale.decide(inputs, band(), T0)
    assert (out[P].desired, out[D].desired) == (2, 4)  # prefill's own scale-down to 1 would leave the band


def test_a_band_result_outside_an_autoscaled_roles_bounds_or_shrinking_a_busy_role_is_not_taken() -> None:
    inputs = {D: given(decode(behavior=NO_DAMPING), 2, [kv(2.0)] * 2),
              P: given(prefill(max=2, behavior=NO_DAMPING), 1, [EngineLoad(queue=4)])}
    out = autoscale.decide(inputs, band(), T0)  # decode to 8 needs prefill 4, above its maxReplicas 2
    assert {(d.desired, d.rule) for d in out.values()} == {(2, Rule.RATIO_REFUSED), (1, Rule.RATIO_REFUSED)}
    assert "outside its minReplicas 1 to maxReplicas 2" in out[P].message
    inputs = {D: given(decode(behavior=NO_DAMPING), 2, [kv(0.25)] * 2),
              P: RoleInput(replicas=2, serving=1, all_serving=False)}
    out = autoscale.decide(inputs, band(), T0)  # decode to 1 would take prefill to 1 mid-restart
    assert (out[D].desired, out[D].rule) == (2, Rule.RATIO_REFUSED) and P not in out


# ---- what is written ----------------------------------------------------------------------------------------

def test_a_status_that_differs_only_in_its_message_is_not_worth_a_write() -> None:
    before = AutoscalingRoleStatus(desired=2, current=2, rule=Rule.TOLERANCE, message="kv 0.51")
    assert not autoscale.worth_writing(before, before.model_copy(update={"message": "kv 0.52"}))
    assert autoscale.worth_writing(before, before.model_copy(update={"rule": Rule.KV_CACHE}))
    assert autoscale.worth_writing(None, before)


def test_a_steady_load_writes_the_status_once() -> None:
    scaling = decode()
    status: AutoscalingRoleStatus | None = None
    writes = 0
    for step in range(100):
        d = one(scaling, 2, [kv(0.5 + 0.02 * (step % 3 - 1))] * 2, T0 + datetime.timedelta(seconds=5 * step),
                status=status)
        if autoscale.worth_writing(status, d.status):
            writes += 1
            status = d.status
        assert d.desired == 2
    assert writes == 1


def test_decision_direction() -> None:
    d = one(decode(behavior=NO_DAMPING), 2, [kv(1.0)] * 2)
    assert d.direction == "up"
    assert dataclasses.replace(d, desired=1).direction == "down"
    assert dataclasses.replace(d, desired=2).direction is None
