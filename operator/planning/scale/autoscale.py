"""`spec.autoscaling`'s decision: how many groups each autoscaled role should run now. Pure.

Per role, from the load of the groups that serve (Ready, Healthy, verified at the role's revision):

1. Recommendation, as the HorizontalPodAutoscaler computes it: per target, the mean per engine over the serving
   groups' leaders against the target; within TOLERANCE of it the role stays as it is, else
   ceil(serving * value / target). The largest over the targets wins (the most loaded signal sizes the role).
   Latency targets read the histograms' growth since the previous poll; a window with no request says nothing.
2. Stabilisation: the recommendation's history (its change points, kept in status.autoscaling) gives the smallest
   recommendation over the scale-up window and the largest over the scale-down window; the role grows only to the
   former and shrinks only to the latter, so a burst shorter than the up window, or a lull shorter than the down
   window, changes nothing. A history starts with the role's size when it was first decided on, so a role newly
   autoscaled (or an operator that lost the status) waits a window too.
3. Step limits (maxGroups up or down per decision), then minReplicas/maxReplicas (applied even without load:
   a role outside its bounds is brought into them), then `minIntervalSeconds` since the role's last scale.
4. Safety: no scale-down while any group of the role is not serving (a rollout, a restart, a group being
   replaced, a surge group): the groups that do serve carry more than their share then, and their load says
   nothing about the role's.
5. `spec.scaling.ratio` (`ratio_band.hold`): Follow moves the other role into the band, Clamp cuts; a result
   that leaves an autoscaled role's bounds, or shrinks a role that is not all serving, is not taken.

Each decision says which rule set the number, with the values read, for the Event, the status and the metrics.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from pdfleet.operator.api.autoscaling import (
    MAX_RECOMMENDATIONS,
    AutoscalingRoleStatus,
    DecodeTargets,
    PrefillTargets,
    Recommendation,
    RoleAutoscaling,
)
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.scaling import OnScale, RatioBand, fraction
from pdfleet.operator.planning.scale import ratio_band
from pdfleet.operator.planning.scale.engine_load import EngineLoad

TOLERANCE = 0.1  # the HPA's: a value within 10% of its target changes nothing, so that noise does nothing
_EPSILON = 1e-9  # values are measured floats (0.33 / 0.3 is 1.1000000000000000888): 10% means 10%


class Rule:
    """What set a decision's number (status.autoscaling.<role>.rule, the decisions metric's `rule`)."""

    QUEUE = "QueuePerEngine"
    RUNNING = "RunningPerEngine"
    KV_CACHE = "KVCacheUsage"
    TTFT = "TimeToFirstToken"
    ITL = "InterTokenLatency"
    TOLERANCE = "Tolerance"  # every target within TOLERANCE: as it is
    NO_METRICS = "NoMetrics"  # no serving group answered with its load: as it is
    STABILIZED_UP = "StabilizedUp"
    STABILIZED_DOWN = "StabilizedDown"
    STEP_LIMIT = "StepLimit"
    MIN_REPLICAS = "MinReplicas"
    MAX_REPLICAS = "MaxReplicas"
    MIN_INTERVAL = "MinInterval"
    NOT_ALL_SERVING = "NotAllServing"
    RATIO_FOLLOW = "RatioFollow"
    RATIO_CLAMP = "RatioClamp"
    RATIO_REFUSED = "RatioRefused"


@dataclasses.dataclass(frozen=True)
class RoleInput:
    """What the decision for one role reads."""

    replicas: int  # spec.<role>.replicas now
    serving: int  # groups Ready, Healthy and verified at the role's revision
    all_serving: bool  # every group of the role serves, and there are exactly `replicas` of them
    loads: tuple[EngineLoad, ...] = ()  # one per serving group's leader that answered
    scaling: RoleAutoscaling | None = None  # None: the role is not autoscaled (it may still follow the band)
    status: AutoscalingRoleStatus | None = None  # what the last decision wrote


@dataclasses.dataclass(frozen=True)
class Reading:
    """One target's value against its target."""

    rule: str
    value: float
    target: float
    unit: str = ""
    idle: bool = False  # a latency read as 0: no request finished, none queued or running

    def __str__(self) -> str:
        return f"{_NAMES[self.rule]} {self.value:.{_PLACES[self.rule]}f}{self.unit} (target " \
               f"{self.target:.{_PLACES[self.rule]}f}{self.unit})" + \
               (" (idle: no request finished, queued or running)" if self.idle else "")


_NAMES = {Rule.QUEUE: "queue per engine", Rule.RUNNING: "running per engine", Rule.KV_CACHE: "KV cache usage",
          Rule.TTFT: "time to first token", Rule.ITL: "inter-token latency"}
_PLACES = {Rule.QUEUE: 1, Rule.RUNNING: 1, Rule.KV_CACHE: 2, Rule.TTFT: 0, Rule.ITL: 0}


@dataclasses.dataclass(frozen=True)
class Decision:
    """One role's decision."""

    role: Role
    replicas: int  # before
    desired: int  # after (== replicas: nothing to write to the spec)
    recommendation: int | None  # this poll's, before stabilisation (None: no metrics, or not autoscaled)
    rule: str
    message: str
    readings: tuple[Reading, ...] = ()
    status: AutoscalingRoleStatus | None = None  # what status.autoscaling.<role> should say (None: not autoscaled)

    @property
    def direction(self) -> str | None:
        return "up" if self.desired > self.replicas else "down" if self.desired < self.replicas else None


def readings(scaling: RoleAutoscaling, loads: Sequence[EngineLoad]) -> tuple[Reading, ...]:
    """Every target that has a value now: gauges averaged over the engines, latencies over the window's
    requests (their sums over their counts, so an engine that served more weighs more)."""
    if not loads:
        return ()
    targets = scaling.targets  # type: ignore[attr-defined]
    out: list[Reading] = []
    n = len(loads)
    if targets.queue_per_engine is not None:
        out.append(Reading(Rule.QUEUE, sum(x.queue for x in loads) / n, targets.queue_per_engine))
    if targets.running_per_engine is not None:
        out.append(Reading(Rule.RUNNING, sum(x.running for x in loads) / n, targets.running_per_engine))
    if targets.kv_cache_usage is not None:
        out.append(Reading(Rule.KV_CACHE, sum(x.token_usage for x in loads) / n,
                           float(fraction(targets.kv_cache_usage))))
    latency = (("time_to_first_token_milliseconds", Rule.TTFT, "ttft") if isinstance(targets, PrefillTargets)
               else ("inter_token_latency_milliseconds", Rule.ITL, "itl") if isinstance(targets, DecodeTargets)
               else None)
    if latency is not None and (target := getattr(targets, latency[0])) is not None:
        count = sum(getattr(x, f"{latency[2]}_count") for x in loads)
        if count > 0:
            seconds = sum(getattr(x, f"{latency[2]}_sum") for x in loads) / count
            out.append(Reading(latency[1], seconds * 1000, target, " ms"))
        elif all(x.queue == 0 and x.running == 0 for x in loads):
            # Engines with nothing to do have no latency to measure: read as missing, a role sized on latency
            # alone would keep its peak size for as long as no traffic comes. Requests queued or running while
            # none finished (a stall) still say nothing.
            out.append(Reading(latency[1], 0.0, target, " ms", idle=True))
    return tuple(out)


def _within(ratio: float) -> bool:
    return abs(ratio - 1) <= TOLERANCE + _EPSILON


def recommend(replicas: int, serving: int, found: Sequence[Reading]) -> tuple[int, str]:
    """The HPA's rule over the readings: (the recommended size, the rule that gave it)."""
    best: tuple[int, str] | None = None
    for reading in found:
        ratio = reading.value / reading.target
        if _within(ratio):
            proposal = replicas
        else:
            # Fractions, so that 0.3 * 10 / 0.3 is exactly 10, not 11 by one ulp.
            proposal = math.ceil(Fraction(serving) * Fraction(reading.value) / Fraction(reading.target))
        if best is None or proposal > best[0]:
            best = (proposal, reading.rule)
    if best is None:
        return replicas, Rule.NO_METRICS
    if best[0] == replicas and all(_within(r.value / r.target) for r in found):
        return replicas, Rule.TOLERANCE
    return best


def remember(history: Sequence[Recommendation], value: int, now: datetime.datetime,
             keep: datetime.timedelta) -> tuple[Recommendation, ...]:
    """`history` with `value` recorded at `now` if it differs from the last one, trimmed to `keep` back (the one
    entry in effect at the window's start kept) and to MAX_RECOMMENDATIONS: past it the two oldest entries become
    one holding the larger value from the older's time, so a load that keeps changing can only delay a
    scale-down, never bring one forward (the oldest entries matter to the longer window, the scale-down's)."""
    kept = list(history)
    if not kept or kept[-1].replicas != value:
        kept.append(Recommendation(time=now, replicas=value))
    start = now - keep
    while len(kept) > 1 and kept[1].time <= start:
        kept.pop(0)
    while len(kept) > MAX_RECOMMENDATIONS:
        first, second = kept.pop(0), kept.pop(0)
        kept.insert(0, Recommendation(time=first.time, replicas=max(first.replicas, second.replicas)))
    return tuple(kept)


def in_window(history: Sequence[Recommendation], now: datetime.datetime, seconds: int) -> list[int]:
    """The recommendations in effect at some moment of the last `seconds`: those made in it, and the one in
    effect when it began."""
    start = now - datetime.timedelta(seconds=seconds)
    values = [r.replicas for r in history if r.time > start]
    before = [r.replicas for r in history if r.time <= start]
    return values + before[-1:]


def _role_decision(role: Role, given: RoleInput, now: datetime.datetime) -> Decision:
    scaling = given.scaling
    assert scaling is not None
    behavior = scaling.behavior
    replicas = given.replicas
    last = given.status
    found = readings(scaling, given.loads)
    history = last.recommendations if last is not None else ()
    if not history:
        # A role autoscaled for the first time (or whose status was lost) starts from its size as if that had
        # been recommended now: a first decision does not shrink it before a down window of lower load.
        history = (Recommendation(time=now, replicas=replicas),)
    recommendation: int | None = None
    if found and given.serving > 0:
        recommendation, rule = recommend(replicas, given.serving, found)
        keep = datetime.timedelta(seconds=max(behavior.window(up=True), behavior.window(up=False)))
        history = remember(history, recommendation, now, keep)
        up = min(in_window(history, now, behavior.window(up=True)))
        down = max(in_window(history, now, behavior.window(up=False)))
        desired = up if up > replicas else down if down < replicas else replicas
        if desired != recommendation:
            rule = Rule.STABILIZED_UP if recommendation > replicas else Rule.STABILIZED_DOWN
    else:
        desired, rule = replicas, Rule.NO_METRICS
    said = ", ".join(str(r) for r in found) or "no serving group answered with its load"
    why = f"{said}, over {given.serving} serving group(s)"
    if recommendation is not None and recommendation != replicas:
        why += f"; recommends {recommendation}"
    if desired > replicas + behavior.step(up=True):
        desired, rule = replicas + behavior.step(up=True), Rule.STEP_LIMIT
    elif desired < replicas - behavior.step(up=False):
        desired, rule = replicas - behavior.step(up=False), Rule.STEP_LIMIT
    if desired < scaling.min_replicas:
        desired, rule = scaling.min_replicas, Rule.MIN_REPLICAS
        why += f"; held at minReplicas {scaling.min_replicas}"
    elif desired > scaling.max_replicas:
        desired, rule = scaling.max_replicas, Rule.MAX_REPLICAS
        why += f"; held at maxReplicas {scaling.max_replicas}"
    if desired < replicas and not given.all_serving:
        desired, rule = replicas, Rule.NOT_ALL_SERVING
        why += "; not every group of the role serves (a rollout, a restart or a replacement): no scale-down"
    last_scale = last.last_scale_time if last is not None else None
    if desired != replicas and last_scale is not None and \
            (now - last_scale).total_seconds() < behavior.min_interval_seconds:
        desired, rule = replicas, Rule.MIN_INTERVAL
        why += f"; last scaled at {last_scale:%H:%M:%SZ}, minIntervalSeconds {behavior.min_interval_seconds}"
    status = AutoscalingRoleStatus(desired=desired, current=given.serving, rule=rule,
                                   message=f"{role} {replicas} -> {desired} ({rule}): {why}"[:1024],
                                   last_scale_time=last_scale, recommendations=history)
    return Decision(role, replicas, desired, recommendation, rule, status.message or "", found, status)


def _band_note(decision: Decision, desired: int, rule: str, note: str) -> Decision:
    status = decision.status
    message = f"{decision.role} {decision.replicas} -> {desired} ({rule}): {note}; before the band: " \
              f"{decision.message}"[:1024]
    if status is not None:
        status = status.model_copy(update={"desired": desired, "rule": rule, "message": message})
    return dataclasses.replace(decision, desired=desired, rule=rule, message=message, status=status)


def decide(inputs: Mapping[Role, RoleInput], band: RatioBand | None, now: datetime.datetime) -> dict[Role, Decision]:
    """Both roles' decisions (a role not autoscaled gets one only when the band moves it)."""
    decisions = {role: _role_decision(role, given, now) for role, given in inputs.items()
                 if given.scaling is not None}
    current = {role: inputs[role].replicas for role in Role}
    scaled = {role: d.desired for role, d in decisions.items() if d.desired != d.replicas}
    if not scaled:
        return decisions
    held = ratio_band.hold(band, current, scaled)
    if held.refusal is not None:
        return {role: _band_note(d, d.replicas, Rule.RATIO_REFUSED, held.refusal) for role, d in decisions.items()}
    if held.note is None:
        return decisions
    out = dict(decisions)
    rule = Rule.RATIO_CLAMP if band is not None and band.on_scale is OnScale.CLAMP else Rule.RATIO_FOLLOW
    for role in Role:
        final = held.replicas[role]
        d = decisions.get(role)
        if d is None:
            if final != current[role]:
                out[role] = Decision(role, current[role], final, None, rule,
                                     f"{role} {current[role]} -> {final} ({rule}): {held.note}")
        elif final != d.desired:
            out[role] = _band_note(d, final, rule, held.note)
    blocked = _blocked(out, inputs)
    if blocked is not None:
        return {role: _band_note(d, d.replicas, Rule.RATIO_REFUSED, blocked) for role, d in decisions.items()}
    return out


def _blocked(decisions: Mapping[Role, Decision], inputs: Mapping[Role, RoleInput]) -> str | None:
    """Why the band's result may not be taken: it shrinks a role that is not all serving, or moves an
    autoscaled role outside its bounds."""
    for role, d in decisions.items():
        given = inputs[role]
        if d.desired < d.replicas and not given.all_serving:
            return f"the band would shrink {role}, which is not all serving"
        scaling = given.scaling
        if scaling is not None and d.desired != d.replicas and \
                not scaling.min_replicas <= d.desired <= scaling.max_replicas:
            return f"the band would take {role} to {d.desired}, outside its minReplicas {scaling.min_replicas} " \
                   f"to maxReplicas {scaling.max_replicas}"
    return None


def scaled(status: AutoscalingRoleStatus, now: datetime.datetime) -> AutoscalingRoleStatus:
    """The status once its decision was written into the spec."""
    return status.model_copy(update={"last_scale_time": now})


def worth_writing(before: AutoscalingRoleStatus | None, after: AutoscalingRoleStatus | None) -> bool:
    """Whether a role's status says something new: its message carries this poll's values, which change at
    every poll, so it alone is no reason to write (a status write costs a write and a watch event, and the
    planner's next reconcile)."""
    if after is None or before is None:
        return after is not before
    return after.model_copy(update={"message": before.message}) != before
