"""What the operator does about a sick engine group: capture evidence, then restart it as a unit, with backoff,
within a budget; past the budget, leave it for a person (docs/architecture.md, "Rank health"). Pure: time comes in as
`now`, evidence bundles as the ConfigMaps the pool owns.

The decision for a group in Desync, Hang or Dead, in order:
1. no evidence of this episode yet (and capture enabled): ask the executor to capture it (`EvidenceRequest`),
   also when the budget is spent: the person it is left for needs it;
2. the budget (`restartBudget.count` restarts per `window`) spent: no restart, the group is marked
   `budgetExhausted` (once: one Warning);
3. the backoff since the last restart not over (`backoff.initial` doubling per restart in the window, capped
   at `backoff.max`): wait; a later reconcile (resync or the next verdict poke) looks again;
4. otherwise: restart (every pod deleted; the normal reconcile recreates them).
`restartBudget.count: 0` detects and reports only: nothing is captured or restarted, nothing is exhausted.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pdfleet.operator.api.health import HealthSpec
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.api.status import GroupStatus, Verdict
from pdfleet.operator.render import labels
from pdfleet.operator.render.context import RenderContext

Body = dict[str, Any]

RESTARTABLE = (Verdict.DESYNC, Verdict.HANG, Verdict.DEAD)
EVIDENCE = f"{labels.PREFIX}/evidence"  # label on evidence ConfigMaps: "true"
EVIDENCE_VERDICT = f"{labels.PREFIX}/evidence-verdict"  # annotations: what was judged, and when
EVIDENCE_TIME = f"{labels.PREFIX}/evidence-time"
EXHAUSTED = "restart budget exhausted"


class Action(enum.StrEnum):
    NONE = "None"
    CAPTURE = "Capture"  # evidence first
    PENDING = "Pending"  # evidence written, not seen yet
    WAIT = "Wait"  # backoff
    RESTART = "Restart"
    EXHAUSTED = "Exhausted"


@dataclasses.dataclass(frozen=True)
class EvidenceRequest:
    """Evidence the executor is to capture from a group's agents and store in the ConfigMap `metadata` names."""

    group: str
    verdict: Verdict
    message: str
    pods: tuple[str, ...]
    metadata: Body
    records: bool
    stacks: bool


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    status: GroupStatus
    evidence: str | None = None  # the ConfigMap holding this episode's evidence (or the newest one)
    request: EvidenceRequest | None = None


def evidence_enabled(health: HealthSpec) -> bool:
    return health.evidence.keep > 0 and (health.evidence.rank_records or health.evidence.stacks)


def evidence_name(group: str, n: int) -> str:
    return f"{group}-evidence-{n}"


def _number(group: str, name: str) -> int | None:
    match = re.fullmatch(re.escape(group) + r"-evidence-(\d+)", name)
    return int(match.group(1)) if match else None


def evidence_of(configmaps: Sequence[Body], group: str) -> list[tuple[int, Body]]:
    """The group's evidence ConfigMaps, oldest (lowest number) first."""
    found = []
    for cm in configmaps:
        meta = cm["metadata"]
        if (meta.get("labels") or {}).get(EVIDENCE) != "true" or (meta.get("labels") or {}).get(labels.GROUP) != group:
            continue
        n = _number(group, meta["name"])
        if n is not None:
            found.append((n, cm))
    return sorted(found, key=lambda item: item[0])


def is_evidence(obj: Body) -> bool:
    return obj.get("kind") == "ConfigMap" and ((obj["metadata"].get("labels") or {}).get(EVIDENCE) == "true")


def _time(value: str | None) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def backoff(health: HealthSpec, restarts_in_window: int) -> datetime.timedelta:
    """Delay after the last restart before the next: `initial`, doubling per restart in the window, up to `max`."""
    if restarts_in_window <= 0:
        return datetime.timedelta(0)
    initial = parse_duration(health.backoff.initial)
    return min(parse_duration(health.backoff.max), initial * 2 ** (restarts_in_window - 1))


def in_window(health: HealthSpec, status: GroupStatus, now: datetime.datetime) -> tuple[datetime.datetime, ...]:
    since = now - parse_duration(health.restart_budget.window)
    return tuple(t for t in status.recent_restarts if t > since)


def restarted(health: HealthSpec, status: GroupStatus, now: datetime.datetime, message: str | None = None
              ) -> GroupStatus:
    """The group's status after a restart at `now` (any restart: an ended pod's too)."""
    recent = (*in_window(health, status, now), now)[-100:]
    return status.model_copy(update={"restarts": status.restarts + 1, "last_restart_time": now,
                                     "recent_restarts": recent, "budget_exhausted": False,
                                     **({"message": message} if message else {})})


def decide(health: HealthSpec, ctx: RenderContext, status: GroupStatus, *, judged: bool, pods: Sequence[Body],
           configmaps: Sequence[Body], pending: Mapping[tuple[str, str], str], now: datetime.datetime) -> Decision:
    """What to do about one group. `judged`: its pods all run and its verdict comes from its agents;
    `pending`: objects written but not yet seen (the executor's expectations)."""
    if status.verdict not in RESTARTABLE or not judged or health.restart_budget.count == 0:
        if status.budget_exhausted and status.verdict not in RESTARTABLE:
            status = status.model_copy(update={"budget_exhausted": False})
        return Decision(Action.NONE, status)
    bundles = evidence_of(configmaps, status.name)
    newest = bundles[-1][1]["metadata"]["name"] if bundles else None
    episode = None
    for _, cm in reversed(bundles):
        ann = cm["metadata"].get("annotations") or {}
        at = _time(ann.get(EVIDENCE_TIME))
        if ann.get(EVIDENCE_VERDICT) == status.verdict and at is not None and \
                (status.last_restart_time is None or at >= status.last_restart_time):
            episode = cm["metadata"]["name"]
            break
    if episode is None and evidence_enabled(health):
        n = (bundles[-1][0] if bundles else 0) + 1
        name = evidence_name(status.name, n)
        if ("ConfigMap", name) in pending or any(_number(status.name, k[1]) is not None
                                                 for k in pending if k[0] == "ConfigMap"):
            return Decision(Action.PENDING, status)
        group_labels = {**labels.common(ctx.pool, "evidence"), labels.GROUP: status.name, EVIDENCE: "true"}
        meta = ctx.metadata(name, group_labels, {EVIDENCE_VERDICT: str(status.verdict),
                                                 EVIDENCE_TIME: now.strftime("%Y-%m-%dT%H:%M:%SZ")})
        request = EvidenceRequest(status.name, status.verdict, status.message or "",
                                  tuple(sorted(p["metadata"]["name"] for p in pods)), meta,
                                  records=health.evidence.rank_records, stacks=health.evidence.stacks)
        return Decision(Action.CAPTURE, status, request=request)
    recent = in_window(health, status, now)
    if len(recent) >= health.restart_budget.count:
        if status.budget_exhausted and (status.message or "").startswith(EXHAUSTED):
            return Decision(Action.EXHAUSTED, status, evidence=newest)
        where = f"evidence in ConfigMap {newest}" if newest else "no evidence kept"
        message = (f"{EXHAUSTED}: {len(recent)} restarts in {health.restart_budget.window}; left for a person; "
                   f"{where}")
        return Decision(Action.EXHAUSTED, status.model_copy(update={"budget_exhausted": True, "message": message}),
                        evidence=newest)
    if status.last_restart_time is not None and now < status.last_restart_time + backoff(health, len(recent)):
        return Decision(Action.WAIT, status, evidence=episode)
    return Decision(Action.RESTART, status, evidence=episode)


def stale_evidence(health: HealthSpec, configmaps: Sequence[Body], groups: Sequence[str]) -> list[Body]:
    """Evidence bundles past `evidence.keep` per group, oldest first (what to delete)."""
    names = {(cm["metadata"].get("labels") or {}).get(labels.GROUP) for cm in configmaps if is_evidence(cm)}
    stale = []
    for group in sorted(n for n in names | set(groups) if n):
        bundles = evidence_of(configmaps, group)
        stale += [cm for _, cm in bundles[:max(0, len(bundles) - health.evidence.keep)]]
    return stale
