"""The bake: a group of a new revision serves for `rollout.verification.bake` before it counts as verified. Pure.

A configuration that applies cleanly can still break a fleet only once it serves (a desync after a few minutes
of batches, a bad kernel on some shapes, a share of requests failing). So after its other gates passed, a group
bakes: at every poll its pods must stay Ready and its ranks out of Desync, Hang and Dead, and what its leader
engine served in the window, read from the counters SGLang publishes on /metrics, is compared with what the
groups of its role still at the old revision served over the same window (canary analysis as Argo Rollouts,
Flagger or Kayenta do it: new against baseline on the same traffic, not against fixed numbers alone):

- the share of aborted requests, at every poll once `analysis.minRequests` are in, against the baseline's plus
  `maxErrorRateIncrease`;
- the same for the share of requests the pool's routers saw fail at the engine (sglang-router's per-worker
  `smg_worker_cb_outcomes_total`): failures the engine cannot count itself (refused connections, resets, 5xx
  from a crashing server), and that the router's retries may have hidden from clients;
- at the bake's end, mean time to first token (prefill) or mean inter-token latency (decode), against the
  baseline's times `ttftRatio` / `itlRatio`.

The window's start (when the bake began, and every engine's counters then) is kept in the group's status
(`status.groups[].verification.bake`), so an operator restarted mid-bake resumes the same analysis. Engine counters
that went down mean the engine restarted inside its pod: that is a failure of the bake too. Router counters that
went down mean a router pod was replaced: its window is lost, nothing more.

Not baked: a pool's first revision (nobody is served yet, nothing to compare with or return to) and a return to
a revision verified before (rolling back must not wait; Argo Rollouts skips its steps the same way).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.rollout import VerificationSpec
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.api.status import Bake, GateResult, GateState, GroupStatus, ServingSample, Verdict

BAKE = "bake"
MAX_BASELINE = 8  # baseline engines whose counters a bake keeps (the status holds them)

# /metrics sample -> ServingSample field (SGLang 0.5.23's names; a histogram's _sum and _count).
_FIELDS = {
    "sglang:num_requests_total": "requests",
    "sglang:num_aborted_requests_total": "aborted",
    "sglang:time_to_first_token_seconds_sum": "ttft_sum",
    "sglang:time_to_first_token_seconds_count": "ttft_count",
    "sglang:inter_token_latency_seconds_sum": "itl_sum",
    "sglang:inter_token_latency_seconds_count": "itl_count",
}


# sglang-router's per-worker outcomes; `worker` is the URL it sends the engine requests at.
_ROUTED = "smg_worker_cb_outcomes_total"


def routed(text: str) -> dict[str, tuple[float, float]] | None:
    """Worker URL -> (requests that ended, of them failed) from a router's /metrics text; None when it does
    not parse."""
    out: dict[str, tuple[float, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                url = s.labels.get("worker")
                if s.name != _ROUTED or not url:
                    continue
                ended, failed = out.get(url, (0.0, 0.0))
                value = max(0.0, float(s.value))
                out[url] = (ended + value, failed + (value if s.labels.get("outcome") == "failure" else 0.0))
    except (ValueError, TypeError):
        return None
    return out


def with_routed(engine: ServingSample, routers: Iterable[Mapping[str, tuple[float, float]]],
                url: str) -> ServingSample:
    """The engine's sample with what every router saw of `url`, its worker URL, summed."""
    seen = [r[url] for r in routers if url in r]
    return engine.model_copy(update={"routed": sum(e for e, _ in seen), "routed_failed": sum(f for _, f in seen)})


# The counter's family as the parser names it (without `_total`). SGLang labels it by `is_streaming`, so an engine
# that has served nothing yet declares it (HELP and TYPE) with no sample: that is 0 requests, not "no metrics".
_REQUESTS_FAMILY = "sglang:num_requests"


def sample(pod: str, text: str) -> ServingSample | None:
    """An engine's counters from its /metrics text, summed over label sets (SGLang labels num_requests_total by
    is_streaming, say); None when the text does not parse or does not declare sglang:num_requests_total."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name == _REQUESTS_FAMILY:
                totals.setdefault("requests", 0.0)
            for s in family.samples:
                field = _FIELDS.get(s.name)
                if field is not None:
                    totals[field] = totals.get(field, 0.0) + float(s.value)
    except (ValueError, TypeError):
        return None
    if "requests" not in totals:
        return None
    return ServingSample(pod=pod, **{k: max(0.0, v) for k, v in totals.items()})


@dataclasses.dataclass(frozen=True)
class Window:
    """What an engine, or a baseline of engines, served between two samples."""

    requests: float = 0.0
    aborted: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    itl_sum: float = 0.0
    itl_count: float = 0.0
    routed: float = 0.0
    routed_failed: float = 0.0

    @property
    def finished(self) -> float:
        return self.requests + self.aborted

    @property
    def error_rate(self) -> float:
        return self.aborted / self.finished if self.finished else 0.0

    @property
    def routed_error_rate(self) -> float:
        return self.routed_failed / self.routed if self.routed else 0.0

    @property
    def ttft(self) -> float | None:
        return self.ttft_sum / self.ttft_count if self.ttft_count else None

    @property
    def itl(self) -> float | None:
        return self.itl_sum / self.itl_count if self.itl_count else None

    def __add__(self, other: Window) -> Window:
        return Window(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))


_ROUTER_FIELDS = ("routed", "routed_failed")


def window(start: ServingSample, now: ServingSample) -> Window | None:
    """The growth from `start` to `now`; None when an engine counter went down (the engine restarted in
    between). Router counters that went down (a router pod replaced) count as no growth."""
    grown = {f.name: getattr(now, f.name) - getattr(start, f.name) for f in dataclasses.fields(Window)}
    if any(v < 0 for k, v in grown.items() if k not in _ROUTER_FIELDS):
        return None
    if any(grown[k] < 0 for k in _ROUTER_FIELDS):
        grown.update(routed=0.0, routed_failed=0.0)
    return Window(**grown)


def begin(*, now: datetime.datetime, duration: datetime.timedelta, leader: ServingSample,
          baseline: Iterable[ServingSample]) -> Bake:
    return Bake(since=now, until=now + duration, start=(leader, *list(baseline)[:MAX_BASELINE]))


@dataclasses.dataclass(frozen=True)
class Judged:
    gate: GateResult
    deadline: datetime.datetime | None = None  # when the gate is judged again at the latest (None: settled)


def _clock(moment: datetime.datetime) -> str:
    return moment.strftime("%H:%M:%SZ")


def _rate(w: Window) -> str:
    said = f"{w.error_rate:.1%} ({w.aborted:.0f} of {w.finished:.0f} aborted)"
    if w.routed:
        said += f", routers saw {w.routed_error_rate:.1%} fail ({w.routed_failed:.0f} of {w.routed:.0f})"
    return said


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f} ms"


def _latency(role: Role, policy: VerificationSpec) -> tuple[str, str, float]:
    """What is compared for `role`: (its name, the Window property, the ratio allowed)."""
    if role is Role.PREFILL:
        return "mean TTFT", "ttft", policy.analysis.ttft_ratio
    return "mean inter-token latency", "itl", policy.analysis.itl_ratio


def numbers(role: Role, policy: VerificationSpec, mine: Window, base: Window | None) -> str:
    name, attr, _ = _latency(role, policy)
    text = f"errors {_rate(mine)}, {name} {_seconds(getattr(mine, attr))}"
    if base is None or base.finished < policy.analysis.min_requests:
        served = 0 if base is None else int(base.finished)
        return f"{text}; baseline: none to compare with ({served} request(s) on the old revision's groups)"
    return f"{text}; baseline {_rate(base)}, {name} {_seconds(getattr(base, attr))}"


def judge(policy: VerificationSpec, role: Role, bake: Bake, *, now: datetime.datetime, leader: str | None,
          samples: Mapping[str, ServingSample], sick: str | None) -> Judged:
    """The bake gate of a group baking since `bake.since`. `leader`: its leader pod's uid now; `samples`: the
    latest counters of the pool's engines by pod uid; `sick`: why the group does not serve now (its pods not
    all Ready, its ranks in Desync, Hang or Dead), None when it does."""
    took = policy.bake
    if sick is not None:
        return _failed(f"stopped serving {_since(bake, now)} into its {took} bake: {sick}")
    start = {s.pod: s for s in bake.start}
    own = bake.start[0] if bake.start else None
    if own is None or leader != own.pod:
        return _failed(f"its leader pod was replaced {_since(bake, now)} into its {took} bake")
    current = samples.get(own.pod)
    if current is None:
        return Judged(GateResult(name=BAKE, state=GateState.WAITING,
                                 message=f"baking until {_clock(bake.until)}: no /metrics from its leader engine "
                                         f"in the last poll"), deadline=_next(bake, policy, now))
    mine = window(own, current)
    if mine is None:
        return _failed(f"its leader engine's counters went back {_since(bake, now)} into its {took} bake: the "
                       f"engine restarted")
    windows = [window(start[s.pod], samples[s.pod]) for s in bake.start[1:] if s.pod in samples]
    base = sum((w for w in windows if w is not None), Window()) if windows else None
    said = numbers(role, policy, mine, base)
    analysis = policy.analysis
    # The baseline compared with: none while the old revision's groups served fewer than minRequests.
    compared = base if base is not None and base.finished >= analysis.min_requests else None
    allowed = (compared.error_rate if compared is not None else 0.0) + analysis.max_error_rate_increase
    if mine.finished >= analysis.min_requests and mine.error_rate > allowed:
        return _failed(f"analysis: error rate {mine.error_rate:.1%} is above the {allowed:.1%} allowed "
                       f"(baseline plus maxErrorRateIncrease {analysis.max_error_rate_increase:g}): {said}")
    routed_base = base if base is not None and base.routed >= analysis.min_requests else None
    allowed = (routed_base.routed_error_rate if routed_base is not None else 0.0) + analysis.max_error_rate_increase
    if mine.routed >= analysis.min_requests and mine.routed_error_rate > allowed:
        return _failed(f"analysis: the routers saw {mine.routed_error_rate:.1%} of the requests they sent it fail, "
                       f"above the {allowed:.1%} allowed (baseline plus maxErrorRateIncrease "
                       f"{analysis.max_error_rate_increase:g}): {said}")
    if now < bake.until:
        left = int((bake.until - now).total_seconds())
        return Judged(GateResult(name=BAKE, state=GateState.WAITING,
                                 message=f"baking until {_clock(bake.until)} ({left}s left): {said}"),
                      deadline=bake.until)
    if mine.finished < analysis.min_requests:
        limit = bake.until + parse_duration(policy.timeout)
        if now >= limit:
            return Judged(GateResult(name=BAKE, state=GateState.TIMED_OUT,
                                     message=f"baked {took}, but served only {mine.finished:.0f} of the "
                                             f"analysis.minRequests {analysis.min_requests} request(s) it is judged "
                                             f"on within verification.timeout {policy.timeout} after: {said}"))
        return Judged(GateResult(name=BAKE, state=GateState.WAITING,
                                 message=f"baked {took}; waiting for traffic to judge: {mine.finished:.0f} of "
                                         f"analysis.minRequests {analysis.min_requests} request(s) served ({said})"),
                      deadline=limit)
    name, attr, ratio = _latency(role, policy)
    new, old = getattr(mine, attr), (getattr(compared, attr) if compared is not None else None)
    if new is not None and old is not None and old > 0 and new > old * ratio:
        return _failed(f"analysis: {name} {_seconds(new)} is {new / old:.1f}x the baseline's {_seconds(old)} "
                       f"(more than the {ratio:g}x allowed): {said}")
    return Judged(GateResult(name=BAKE, state=GateState.PASSED, message=f"baked {took}: {said}"))


def _failed(message: str) -> Judged:
    return Judged(GateResult(name=BAKE, state=GateState.FAILED, message=message[:2048]))


def _since(bake: Bake, now: datetime.datetime) -> str:
    return f"{max(0, int((now - bake.since).total_seconds()))}s"


def _next(bake: Bake, policy: VerificationSpec, now: datetime.datetime) -> datetime.datetime:
    return bake.until if now < bake.until else bake.until + parse_duration(policy.timeout)


def baking(group: GroupStatus) -> Bake | None:
    """The group's bake while it is under way: begun at the revision its pods run, neither passed nor stopped."""
    check = group.verification
    if check is None or check.bake is None or check.revision != group.revision or \
            group.verified_revision == group.revision or \
            any(g.state in (GateState.FAILED, GateState.TIMED_OUT) for g in check.gates):
        return None
    return check.bake


def shortfall(policy: VerificationSpec, record: Bake, samples: Mapping[str, ServingSample],
              now: datetime.datetime) -> int:
    """How many more requests the baking group must serve before it can be judged: 0 when enough, when its
    counters are not known now, or before the bake's midpoint (real traffic gets the first half to show up, so
    a pool that has it is never sent probes)."""
    if now < record.since + (record.until - record.since) / 2:
        return 0
    own = record.start[0] if record.start else None
    current = samples.get(own.pod) if own is not None else None
    grown = window(own, current) if own is not None and current is not None else None
    if grown is None:
        return 0
    return max(0, policy.analysis.min_requests - int(grown.finished))


@dataclasses.dataclass(frozen=True)
class Policy:
    """Whether the groups of the update revision bake, and for how long (`skipped`: why not, for the status)."""

    duration: datetime.timedelta
    skipped: str | None = None


def policy(spec_bake: str, *, current_revision: str | None, update_revision: str,
           verified_before: Sequence[str]) -> Policy:
    """The bake for this reconcile's update revision, from the spec and where the pool comes from."""
    duration = parse_duration(spec_bake)
    if duration <= datetime.timedelta():
        return Policy(duration, "switched off (verification.bake: 0s)")
    if current_revision is None:
        return Policy(duration, "not for the pool's first revision: nothing serves yet to compare with")
    if update_revision in verified_before:
        return Policy(duration, f"revision {update_revision} was verified before: a return to it is not baked")
    return Policy(duration)


# Verdicts that fail a bake (and a watch). Unreachable is not among them: an agent slow to answer on a loaded node
# says nothing about the revision; a group that really stopped shows as Dead, or its pod as ended.
FAILING = frozenset({Verdict.DESYNC, Verdict.HANG, Verdict.DEAD})


def sick_reason(*, ready: bool, state: object, verdict: Verdict | None, message: str | None) -> str | None:
    """Why a baking group does not serve now, or None: its ranks sick, or its pods not all Ready."""
    if verdict in FAILING:
        return f"its ranks are in {verdict}" + (f" ({message})" if message else "")
    if not ready:
        return f"its pods are not all Ready ({state})"
    return None
