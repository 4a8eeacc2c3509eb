"""Every restart of an engine group as a unit has its home here, whatever its cause: the same backoff, the same
budget, the same terminal state (docs/architecture.md, "Restarts"). Pure: time comes in as `now`, evidence
bundles as the ConfigMaps the pool owns, an ended pod's exit as the cluster reported it.

A group needs a restart (`RestartCause`) when a pod of it ended (PodEnded: the exit, from the pod's status, is
its evidence, kept in the group's `lastExit`; its agents are gone with it), or when its verdict is Desync, Hang
or Dead (its agents' records and stacks are the evidence, captured into a ConfigMap). The decision, in order:
1. a verdict with no evidence of this episode yet (and capture enabled): ask the executor to capture it
   (`EvidenceRequest`), also when the budget is spent: the person it is left for needs it;
2. the budget (`restartBudget.count` restarts per `window`) spent: no restart; the group is left for a person,
   `budgetExhausted` (once: one Warning, RestartBudgetExhausted);
3. the backoff since the last restart not over (`backoff.initial` doubling per restart in the window, capped
   at `backoff.max`): wait until `nextRestartTime` (the executor looks again then);
4. otherwise: restart (every pod deleted; the normal reconcile recreates them).
`restartBudget.count: 0` detects and reports only: nothing is captured or restarted, nothing is exhausted; a
group whose pod ended stays as it is.

A person resets a spent budget by deleting the group's pods or by changing the spec (a group whose ended pod
was rendered from another spec is replaced at once, `Action.REPLACE`): the operator never deletes the pods of
a group it left, so a group whose pods went, or were replaced, has been acted on, and its budget starts afresh.
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
from pdfleet.operator.api.status import ContainerExit, GroupStatus, RestartCause, Verdict
from pdfleet.operator.planning.groups import parse_time
from pdfleet.operator.render import labels
from pdfleet.operator.render.context import RenderContext

Body = dict[str, Any]

RESTARTABLE = (Verdict.DESYNC, Verdict.HANG, Verdict.DEAD)
EVIDENCE = f"{labels.PREFIX}/evidence"  # label on evidence ConfigMaps: "true"
EVIDENCE_VERDICT = f"{labels.PREFIX}/evidence-verdict"  # annotations: what was judged, and when
EVIDENCE_TIME = f"{labels.PREFIX}/evidence-time"


class Action(enum.StrEnum):
    NONE = "None"
    CAPTURE = "Capture"  # evidence first
    PENDING = "Pending"  # evidence written, not seen yet
    WAIT = "Wait"  # backoff
    RESTART = "Restart"
    EXHAUSTED = "Exhausted"
    REPLACE = "Replace"  # an ended group rendered from another spec: replaced, its budget afresh


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
    cause: RestartCause | None = None
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


def backoff(health: HealthSpec, restarts_in_window: int) -> datetime.timedelta:
    """Delay after the last restart before the next: `initial`, doubling per restart in the window, up to `max`."""
    if restarts_in_window <= 0:
        return datetime.timedelta(0)
    initial = parse_duration(health.backoff.initial)
    return min(parse_duration(health.backoff.max), initial * 2 ** (restarts_in_window - 1))


def in_window(health: HealthSpec, status: GroupStatus, now: datetime.datetime) -> tuple[datetime.datetime, ...]:
    since = now - parse_duration(health.restart_budget.window)
    return tuple(t for t in status.recent_restarts if t > since)


def restarted(health: HealthSpec, status: GroupStatus, now: datetime.datetime, cause: RestartCause
              ) -> GroupStatus:
    """The group's status after a restart at `now`."""
    recent = (*in_window(health, status, now), now)[-100:]
    return status.model_copy(update={"restarts": status.restarts + 1, "last_restart_time": now,
                                     "recent_restarts": recent, "budget_exhausted": False,
                                     "restart_cause": cause, "next_restart_time": None})


def afresh(status: GroupStatus) -> GroupStatus:
    """The group's status once a person acted on it: nothing left, the budget whole again."""
    return status.model_copy(update={"budget_exhausted": False, "recent_restarts": (), "next_restart_time": None})


def exit_summary(ended: ContainerExit) -> str:
    """One line: which pod ended, how, and the last line it logged."""
    how = ", ".join(part for part in (ended.reason, None if ended.exit_code is None else
                                      f"exit code {ended.exit_code}") if part) or "no reason given"
    last = next((line.strip() for line in reversed((ended.message or "").splitlines()) if line.strip()), "")
    return f"pod {ended.pod} ended ({how})" + (f": {last[:300]}" if last else "")


def cause_of(status: GroupStatus, ended: ContainerExit | None, *, judged: bool) -> RestartCause | None:
    if ended is not None:
        return RestartCause.POD_ENDED
    return RestartCause(str(status.verdict)) if judged and status.verdict in RESTARTABLE else None


def decide(health: HealthSpec, ctx: RenderContext, status: GroupStatus, *, ended: ContainerExit | None,
           judged: bool, gone: bool, outdated: bool, pods: Sequence[Body], configmaps: Sequence[Body],
           pending: Mapping[tuple[str, str], str], now: datetime.datetime) -> Decision:
    """What to do about one group. `ended`: how its ended pod ended, if one did (`groups.ended_exit`); `judged`:
    its pods all run and its verdict comes from its agents; `gone`: some of its pods are missing or going;
    `outdated`: its ended pod was rendered from another spec; `pending`: objects written but not yet seen (the
    executor's expectations)."""
    status = status.model_copy(update={"next_restart_time": None})  # set again below while a wait holds
    if ended is not None:
        status = status.model_copy(update={"last_exit": ended})
    cause = cause_of(status, ended, judged=judged)
    if cause is RestartCause.POD_ENDED and outdated:
        return Decision(Action.REPLACE, afresh(status), cause)
    if cause is None or health.restart_budget.count == 0:
        if status.budget_exhausted:  # what it was left for is over
            status = afresh(status) if gone else status.model_copy(update={"budget_exhausted": False})
        if ended is not None:
            status = status.model_copy(update={"message": f"{exit_summary(ended)}; not restarted: "
                                                          "restartBudget.count is 0"})
        return Decision(Action.NONE, status, cause)
    bundles = evidence_of(configmaps, status.name)
    newest = bundles[-1][1]["metadata"]["name"] if bundles else None
    if ended is not None:
        episode, where = None, exit_summary(ended)
        status = status.model_copy(update={"message": where})
    else:
        episode = _episode(bundles, status, pods)
        where = f"evidence in ConfigMap {newest}" if newest else "no evidence kept"
        if episode is None and evidence_enabled(health):
            return _capture(health, ctx, status, cause, bundles, pods, pending, now)
    recent = in_window(health, status, now)
    # Spent is spent until a person acts: the window sliding on does not start a crash loop again.
    if status.budget_exhausted or len(recent) >= health.restart_budget.count:
        message = (f"restart budget exhausted: {health.restart_budget.count} restarts in "
                   f"{health.restart_budget.window}; left for a person; {where}")
        return Decision(Action.EXHAUSTED, status.model_copy(update={"budget_exhausted": True, "message": message,
                                                                    "restart_cause": cause}),
                        cause, evidence=newest)
    if status.last_restart_time is not None:
        until = status.last_restart_time + backoff(health, len(recent))
        if now < until:
            waiting = {"next_restart_time": until, "restart_cause": cause}
            if ended is not None:
                waiting["message"] = f"{where}; restarting the group at {until:%Y-%m-%dT%H:%M:%SZ} (backoff)"
            return Decision(Action.WAIT, status.model_copy(update=waiting), cause, evidence=episode)
    return Decision(Action.RESTART, status, cause, evidence=episode)


def _episode(bundles: Sequence[tuple[int, Body]], status: GroupStatus, pods: Sequence[Body]) -> str | None:
    """The evidence ConfigMap of the group's current episode: of its verdict, taken since its last restart and
    since its pods were created (a person who deleted the pods of a spent group started a new episode too)."""
    starts = [t for t in (status.last_restart_time, *(parse_time(p["metadata"].get("creationTimestamp"))
                                                      for p in pods)) if t is not None]
    since = max(starts) if starts else None
    for _, cm in reversed(bundles):
        ann = cm["metadata"].get("annotations") or {}
        at = parse_time(ann.get(EVIDENCE_TIME))
        if ann.get(EVIDENCE_VERDICT) == status.verdict and at is not None and (since is None or at >= since):
            return cm["metadata"]["name"]
    return None


def _capture(health: HealthSpec, ctx: RenderContext, status: GroupStatus, cause: RestartCause,
             bundles: Sequence[tuple[int, Body]], pods: Sequence[Body], pending: Mapping[tuple[str, str], str],
             now: datetime.datetime) -> Decision:
    n = (bundles[-1][0] if bundles else 0) + 1
    name = evidence_name(status.name, n)
    if ("ConfigMap", name) in pending or any(_number(status.name, k[1]) is not None
                                             for k in pending if k[0] == "ConfigMap"):
        return Decision(Action.PENDING, status, cause)
    group_labels = {**labels.common(ctx.pool, "evidence"), labels.GROUP: status.name, EVIDENCE: "true"}
    meta = ctx.metadata(name, group_labels, {EVIDENCE_VERDICT: str(status.verdict),
                                             EVIDENCE_TIME: now.strftime("%Y-%m-%dT%H:%M:%SZ")})
    request = EvidenceRequest(status.name, status.verdict, status.message or "",
                              tuple(sorted(p["metadata"]["name"] for p in pods)), meta,
                              records=health.evidence.rank_records, stacks=health.evidence.stacks)
    return Decision(Action.CAPTURE, status, cause, request=request)


def stale_evidence(health: HealthSpec, configmaps: Sequence[Body], groups: Sequence[str]) -> list[Body]:
    """Evidence bundles past `evidence.keep` per group, oldest first (what to delete)."""
    names = {(cm["metadata"].get("labels") or {}).get(labels.GROUP) for cm in configmaps if is_evidence(cm)}
    stale = []
    for group in sorted(n for n in names | set(groups) if n):
        bundles = evidence_of(configmaps, group)
        stale += [cm for _, cm in bundles[:max(0, len(bundles) - health.evidence.keep)]]
    return stale
