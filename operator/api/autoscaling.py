"""`spec.autoscaling`: pdfleet's own autoscaler, per role, on what SGLang publishes on each engine's /metrics.

Off by default (no `spec.autoscaling`, or a role left out of it). For each autoscaled role the operator reads the
load of every group that serves (Ready, Healthy, verified at the current revision) at each health poll and sizes
the role as the HorizontalPodAutoscaler sizes a Deployment (`planning.scale.autoscale`, pure): per target,
desired = ceil(serving groups * mean value per engine / target), the largest over the targets, nothing within 10%
of the target, held by the stabilisation windows, the step limits and `minIntervalSeconds`, then by min/max and
`spec.scaling.ratio`. The decision is written into `spec.<role>.replicas`, which stays the one number the operator
builds from.

An autoscaled role may not also be a `scaleTarget`: two owners of one number (an HPA through the
InferencePoolRole and pdfleet here) would undo each other's writes. That is refused at admission rather than one
made to win silently. With a ratio band, an autoscaled role's bounds must fit the band beside the other role's
(its bounds when it is autoscaled too, else its replicas when the band Clamps); with Follow and a role that is not
autoscaled, that role follows into the band wherever the autoscaled one goes.

Kubernetes APIs carry no floats: KV cache usage is a two-decimal string as the band's ratios are, latencies are
whole milliseconds.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Annotated, Any

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule
from pdfleet.operator.api.conditions import Timestamp
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.scaling import RATIO_PATTERN, OnScale, fraction, hundredths_cel

MAX_GROUPS = 1024  # spec.<role>.replicas' maximum
MAX_WINDOW = 3600  # seconds: longer windows only hide load
MAX_RECOMMENDATIONS = 32  # recommendations kept per role in the status (change points, see AutoscalingRoleStatus)

Groups = Annotated[int, Field(ge=1, le=MAX_GROUPS)]
Seconds = Annotated[int, Field(ge=0, le=MAX_WINDOW)]
Usage = Annotated[str, Field(pattern=RATIO_PATTERN, max_length=7)]
Milliseconds = Annotated[int, Field(ge=1, le=600_000)]
PerEngine = Annotated[int, Field(ge=1, le=100_000)]

# Defaults, for inference rather than web pods: a new group takes minutes to load its model, so a scale-up acts on
# load sustained over a short window (a single poll's burst does nothing) and a scale-down waits five minutes of
# lower load before it gives capacity away, one group at a time.
SCALE_UP_WINDOW = 30
SCALE_DOWN_WINDOW = 300
SCALE_UP_STEP = 2
SCALE_DOWN_STEP = 1
MIN_INTERVAL = 60


_USAGE_IN_RANGE = Rule(
    cel="!has(self.kvCacheUsage) || (double(self.kvCacheUsage) > 0.0 && double(self.kvCacheUsage) <= 1.0)",
    holds=lambda t: t.kv_cache_usage is None or 0 < fraction(t.kv_cache_usage) <= 1,
    message="kvCacheUsage must be above 0 and at most 1 (sglang:token_usage is the share of KV cache in use)",
    field=".kvCacheUsage",
)


def _some_target(extra: str) -> Rule:
    names = ("queuePerEngine", "runningPerEngine", "kvCacheUsage", extra)
    return Rule(
        cel=" || ".join(f"has(self.{name})" for name in names),
        holds=lambda t: any(v is not None for v in t.model_dump(by_alias=True).values()),
        message=f"at least one target is needed ({', '.join(names)}): an autoscaled role needs a signal",
    )


class Targets(ApiModel):
    """Per-engine values the role is sized to hold; each as SGLang 0.5.23 names it on /metrics."""

    queue_per_engine: PerEngine | None = Field(
        default=None, description="Requests waiting per engine (sglang:num_queue_reqs, mean over the role's "
                                  "serving engines). The prefill backlog; decode's stays near 0.")
    running_per_engine: PerEngine | None = Field(
        default=None, description="Requests running per engine (sglang:num_running_reqs, mean over the role's "
                                  "serving engines).")
    kv_cache_usage: Usage | None = Field(
        default=None, description="KV cache in use per engine, 0 to 1 as a decimal string such as \"0.8\" "
                                  "(sglang:token_usage, mean over the role's serving engines). Decode's backlog.")


class PrefillTargets(Targets):
    RULES = (_USAGE_IN_RANGE, _some_target("timeToFirstTokenMilliseconds"))

    time_to_first_token_milliseconds: Milliseconds | None = Field(
        default=None, description="Mean time to first token, in milliseconds, over the requests the role's "
                                  "serving engines finished between two health polls "
                                  "(sglang:time_to_first_token_seconds' _sum and _count growth).")


class DecodeTargets(Targets):
    RULES = (_USAGE_IN_RANGE, _some_target("interTokenLatencyMilliseconds"))

    inter_token_latency_milliseconds: Milliseconds | None = Field(
        default=None, description="Mean inter-token latency, in milliseconds, over the tokens the role's serving "
                                  "engines produced between two health polls "
                                  "(sglang:inter_token_latency_seconds' _sum and _count growth).")


class ScaleRule(ApiModel):
    """How one direction of scaling is damped."""

    stabilization_window_seconds: Seconds | None = Field(
        default=None, description="Scale-up: the role grows only to the smallest recommendation over this window "
                                  f"(default {SCALE_UP_WINDOW}). Scale-down: it shrinks only to the largest "
                                  f"(default {SCALE_DOWN_WINDOW}). 0 acts on each poll's recommendation.")
    max_groups: Groups | None = Field(
        default=None, description=f"Most groups added (default {SCALE_UP_STEP}) or removed (default "
                                  f"{SCALE_DOWN_STEP}) by one decision.")


class Behavior(ApiModel):
    """Damping, so that noise and oscillating load do not flap the role."""

    scale_up: ScaleRule = Field(default_factory=ScaleRule, description="Adding groups.")
    scale_down: ScaleRule = Field(default_factory=ScaleRule, description="Removing groups.")
    min_interval_seconds: Seconds = Field(
        default=MIN_INTERVAL, description="Least time between two scales of the role, either way: a new group's "
                                          "load shows only once it serves.")

    def window(self, up: bool) -> int:
        chosen = (self.scale_up if up else self.scale_down).stabilization_window_seconds
        return chosen if chosen is not None else (SCALE_UP_WINDOW if up else SCALE_DOWN_WINDOW)

    def step(self, up: bool) -> int:
        chosen = (self.scale_up if up else self.scale_down).max_groups
        return chosen if chosen is not None else (SCALE_UP_STEP if up else SCALE_DOWN_STEP)


_MIN_BELOW_MAX = Rule(
    cel="(has(self.minReplicas) ? self.minReplicas : 1) <= self.maxReplicas",
    holds=lambda r: r.min_replicas <= r.max_replicas,
    message="minReplicas must not exceed maxReplicas",
    field=".maxReplicas",
)


class RoleAutoscaling(ApiModel):
    """What pdfleet holds one role to."""

    RULES = (_MIN_BELOW_MAX,)

    min_replicas: Groups = Field(default=1, description="Fewest groups the autoscaler leaves the role.")
    max_replicas: Groups = Field(description="Most groups the autoscaler gives the role.")
    behavior: Behavior = Field(default_factory=Behavior, description="Stabilisation, step limits, interval.")


class PrefillAutoscaling(RoleAutoscaling):
    targets: PrefillTargets = Field(description="Per-engine values to hold; the role follows the one most "
                                                "exceeded.")


class DecodeAutoscaling(RoleAutoscaling):
    targets: DecodeTargets = Field(description="Per-engine values to hold; the role follows the one most "
                                               "exceeded.")


class AutoscalingSpec(ApiModel):
    """The roles pdfleet sizes itself; a role left out keeps its replicas."""

    prefill: PrefillAutoscaling | None = Field(default=None, description="Prefill groups; not autoscaled if unset.")
    decode: DecodeAutoscaling | None = Field(default=None, description="Decode groups; not autoscaled if unset.")

    def role(self, role: Role) -> RoleAutoscaling | None:
        return self.prefill if role is Role.PREFILL else self.decode


# ---- rules of the whole spec (InferencePoolSpec's RULES; `s` is the spec)

def _other(role: Role) -> Role:
    return Role.DECODE if role is Role.PREFILL else Role.PREFILL


def _autoscaled_cel(role: Role) -> str:
    return f"has(self.autoscaling) && has(self.autoscaling.{role})"


def one_owner(role: Role) -> Rule:
    return Rule(
        cel=f"!({_autoscaled_cel(role)}) || !has(self.{role}.scaleTarget) || !self.{role}.scaleTarget",
        holds=lambda s: s.autoscaling.role(role) is None or not s.role(role).scale_target,
        message=f"autoscaling.{role} and {role}.scaleTarget may not both be set: two owners of {role}.replicas "
                "(pdfleet's autoscaler and whatever scales the InferencePoolRole) would undo each other's writes",
        field=f".autoscaling.{role}",
    )


def _cel_bound(role: Role, bound: str) -> str:
    """The role's bound as CEL: its autoscaling bound when autoscaled, else its replicas (defaults filled in)."""
    default = 1 if bound == "minReplicas" else None
    own = f"self.autoscaling.{role}.{bound}"
    if default is not None:
        own = f"(has({own}) ? {own} : {default})"
    return f"({_autoscaled_cel(role)} ? {own} : (has(self.{role}.replicas) ? self.{role}.replicas : 1))"


def _py_bound(s: Any, role: Role, low: bool) -> int:
    scaling = s.autoscaling.role(role)
    if scaling is None:
        return int(s.role(role).replicas)
    return int(scaling.min_replicas if low else scaling.max_replicas)


def _band_cel(prefill: str, decode: str) -> str:
    band = "self.scaling.ratio"
    return (f"({decode} * 100 >= {hundredths_cel(band + '.minDecodePerPrefill')} * {prefill} && "
            f"{decode} * 100 <= {hundredths_cel(band + '.maxDecodePerPrefill')} * {prefill})")


def _py_in_band(s: Any, prefill: int, decode: int) -> bool:
    low: Fraction = s.scaling.ratio.low
    high: Fraction = s.scaling.ratio.high
    return bool(low * prefill <= decode <= high * prefill)


def bounds_in_band(role: Role) -> Rule:
    """An autoscaled role's minReplicas beside the other role's low bound, and its maxReplicas beside the other's
    high bound, lie in the band: checked when the other role is autoscaled too, or is fixed and the band Clamps
    (a Follow band moves a fixed other role wherever this one goes)."""
    other = _other(role)
    clamp = f"(has(self.scaling.ratio.onScale) && self.scaling.ratio.onScale == '{OnScale.CLAMP}')"
    checked = f"{_autoscaled_cel(role)} && has(self.scaling) && has(self.scaling.ratio) && " \
              f"(({_autoscaled_cel(other)}) || {clamp})"

    def pair(bound: str) -> str:
        sizes = {role: _cel_bound(role, bound), other: _cel_bound(other, bound)}
        return _band_cel(sizes[Role.PREFILL], sizes[Role.DECODE])

    def holds(s: Any) -> bool:
        if s.autoscaling.role(role) is None or s.scaling.ratio is None:
            return True
        if s.autoscaling.role(other) is None and s.scaling.ratio.on_scale is not OnScale.CLAMP:
            return True
        return all(_py_in_band(s, _py_bound(s, Role.PREFILL, low), _py_bound(s, Role.DECODE, low))
                   for low in (True, False))

    beside = f"the other role's (its autoscaling bounds when it is autoscaled, else {other}.replicas)"
    return Rule(
        cel=f"!({checked}) || ({pair('minReplicas')} && {pair('maxReplicas')})",
        holds=holds,
        message=f"autoscaling.{role}.minReplicas and maxReplicas must lie within scaling.ratio beside {beside}: "
                "minReplicas beside the other's lowest size and maxReplicas beside its highest, or the autoscaler "
                "could never reach them; widen the band or change the bounds",
        field=f".autoscaling.{role}",
    )


SPEC_RULES: tuple[Rule, ...] = (one_owner(Role.PREFILL), one_owner(Role.DECODE),
                                bounds_in_band(Role.PREFILL), bounds_in_band(Role.DECODE))


# ---- status.autoscaling

class Recommendation(ApiModel):
    """A role's recommended size from the moment it took this value until the next entry."""

    time: Timestamp = Field(description="When the recommendation took this value.",
                            json_schema_extra={"format": "date-time"})
    replicas: Annotated[int, Field(ge=0, le=MAX_GROUPS)] = Field(description="The recommended size.")


class AutoscalingRoleStatus(ApiModel):
    """What the autoscaler last decided for one role, and why."""

    desired: Annotated[int, Field(ge=0, le=MAX_GROUPS)] = Field(default=0, description="The size it wants now.")
    current: Annotated[int, Field(ge=0, le=MAX_GROUPS)] = Field(
        default=0, description="Groups that served (Ready, Healthy, verified at the current revision) when it "
                               "decided.")
    rule: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description="The rule that set desired (a target such as KVCacheUsage, Tolerance, "
                                  "StabilizedDown, StepLimit, MinInterval, NotAllServing, MinReplicas, "
                                  "MaxReplicas, RatioFollow, RatioClamp).")
    message: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, description="The decision in words, with the metric values it read.")
    last_scale_time: Timestamp | None = Field(
        default=None, description="When the autoscaler last changed the role's replicas.",
        json_schema_extra={"format": "date-time"})
    recommendations: tuple[Recommendation, ...] = Field(
        default=(), max_length=MAX_RECOMMENDATIONS,
        description="The recommendation's changes within the longer stabilisation window (oldest first): a "
                    "recommendation holds until the next entry, so an unchanged one is written once, not per "
                    "poll. The windows read them, so an operator restarted mid-window decides the same.")


class AutoscalingStatus(ApiModel):
    """Per autoscaled role."""

    prefill: AutoscalingRoleStatus | None = Field(default=None, description="Prefill.")
    decode: AutoscalingRoleStatus | None = Field(default=None, description="Decode.")

    def role(self, role: Role) -> AutoscalingRoleStatus | None:
        return self.prefill if role is Role.PREFILL else self.decode

