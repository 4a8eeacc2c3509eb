"""What `pdfleet status` and `pdfleet rollout status` print, and the exit code, from a pool as the API returns it
(plus its pods, Events and evidence ConfigMaps). Pure: no I/O, time comes in as `now`, so the output is a function
of recorded JSON (`tests/unit/test_cli_report.py`).

The status is read with the API models, so the CLI reads exactly what the operator writes; a status this
pdfleet cannot read is an error (`Unreadable`), never guessed at.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from pdfleet.operator.api.conditions import Condition, ConditionStatus, ConditionType
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.status import GateState, GroupStatus, InferencePoolStatus, Phase
from pdfleet.operator.planning import patch_set
from pdfleet.operator.planning.groups import parse_time, pod_ready, pods_by_group
from pdfleet.operator.planning.health.restarts import EVIDENCE_TIME
from pdfleet.operator.planning.rollout import rollback
from pdfleet.operator.render import revision

Body = dict[str, Any]
BAR_WIDTH = 24
# Conditions whose status says all is well; any other (type, status) is shown by `pdfleet status`.
FINE = {(ConditionType.ACCEPTED, ConditionStatus.TRUE), (ConditionType.READY, ConditionStatus.TRUE),
        (ConditionType.PROGRESSING, ConditionStatus.FALSE), (ConditionType.DEGRADED, ConditionStatus.FALSE),
        (ConditionType.ROLLOUT_VERIFIED, ConditionStatus.TRUE),
        (ConditionType.TOOL_CALL_INTEGRITY, ConditionStatus.TRUE)}


class Unreadable(ValueError):
    """The pool's status does not parse with this pdfleet's API models (an operator of another version)."""


class Exit(enum.IntEnum):
    """Exit codes, as `kubectl rollout status` has them, plus one for a rollout still going without --watch."""

    COMPLETE = 0  # the rollout completed verified
    FAILED = 1  # a gate failed or timed out, the spec was rejected, the pool went away, or --timeout passed
    ERROR = 2  # usage, kubeconfig, connection, permission, pool not found
    IN_PROGRESS = 3  # still rolling out (only without --watch)


@dataclasses.dataclass(frozen=True)
class Rollout:
    """Where a pool's rollout stands."""

    outcome: Exit
    done: int  # groups at the update revision that passed verification
    total: int  # groups the spec asks for
    revision: str | None  # the update revision
    detail: str  # why it failed, what it waits for, or that it is done


def read_status(pool: Mapping[str, Any]) -> InferencePoolStatus:
    try:
        return InferencePoolStatus.model_validate(pool.get("status") or {})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise Unreadable(f"the status of InferencePool {name_of(pool)} does not parse with this pdfleet's API "
                         f"(an operator of another version?): status.{where}: {first['msg']}") from None


def name_of(pool: Mapping[str, Any]) -> str:
    meta = pool.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _condition(status: InferencePoolStatus, type_: ConditionType) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def _verified(group: GroupStatus) -> bool:
    return group.verified_revision is not None and group.verified_revision == group.revision


def waiting_gate(status: InferencePoolStatus) -> str | None:
    """The first verification gate a group of the pool waits on (status order: roles in rollout order), as
    'gate G of ROLE group NAME: message'; None when no group waits on a gate."""
    for group in status.groups:
        if _verified(group) or group.verification is None or group.verification.revision != group.revision:
            continue
        for gate in group.verification.gates:
            if gate.state is GateState.WAITING:
                return f"gate {gate.name} of {group.role} group {group.name}: {gate.message}"
    return None


def rollout(pool: Mapping[str, Any]) -> Rollout:
    """The rollout's outcome and progress. Complete: the operator has seen the latest spec, RolloutVerified is
    True and currentRevision == updateRevision. Failed: RolloutVerified False (GateFailed, GateTimedOut), phase
    Failed, or the spec rejected (Accepted False). Anything older than the spec's generation is not trusted."""
    status = read_status(pool)
    total = status.prefill.desired + status.decode.desired
    done = status.prefill.updated + status.decode.updated
    update = status.update_revision
    generation = (pool.get("metadata") or {}).get("generation")

    def at(outcome: Exit, detail: str) -> Rollout:
        return Rollout(outcome, done, total, update, detail)

    back = rollback.rolled_back(pool)
    if back is not None and back.cause != rollback.UNDO:
        # The operator replaced the spec this rollout was of: it failed, whatever the rollback's progress.
        return at(Exit.FAILED, _rolled_back(back, status, generation))
    if status.observed_generation is None or (generation is not None and status.observed_generation < generation):
        # The revision and counts are of an older spec: none of it is progress towards this one.
        seen = "no generation" if status.observed_generation is None else f"generation {status.observed_generation}"
        return Rollout(Exit.IN_PROGRESS, 0, total, None, f"waiting for the operator to observe generation "
                                                         f"{generation} (status is of {seen})")
    accepted = _condition(status, ConditionType.ACCEPTED)
    if accepted is not None and accepted.status is ConditionStatus.FALSE:
        return at(Exit.FAILED, f"spec rejected ({accepted.reason}): {accepted.message}")
    verified = _condition(status, ConditionType.ROLLOUT_VERIFIED)
    if verified is not None and verified.status is ConditionStatus.FALSE:
        return at(Exit.FAILED, f"{verified.reason}: {verified.message}")
    if status.phase is Phase.FAILED:
        return at(Exit.FAILED, f"phase Failed: {verified.message if verified else 'no RolloutVerified condition'}")
    if verified is not None and verified.status is ConditionStatus.TRUE and status.current_revision is not None \
            and status.current_revision == update:
        return at(Exit.COMPLETE, verified.message)
    progressing = _condition(status, ConditionType.PROGRESSING)
    if progressing is not None and progressing.reason == "Paused":
        return at(Exit.IN_PROGRESS, f"Paused: {progressing.message}")
    gate = waiting_gate(status)
    if gate is not None:
        return at(Exit.IN_PROGRESS, f"waiting for {gate}")
    why = verified or progressing
    return at(Exit.IN_PROGRESS, f"{why.reason}: {why.message}" if why else "waiting for the operator's first status")


def _rolled_back(back: rollback.RolledBack, status: InferencePoolStatus, generation: int | None) -> str:
    verified = _condition(status, ConditionType.ROLLOUT_VERIFIED)
    if status.observed_generation != generation or verified is None:
        progress = "the operator has not observed the rolled-back spec yet"
    elif verified.status is ConditionStatus.TRUE and status.current_revision == back.to_revision:
        progress = f"revision {back.to_revision} is verified again"
    else:
        progress = f"returning to revision {back.to_revision}: {verified.reason}: {verified.message}"
    return f"rolled back from revision {back.from_revision} to {back.to_revision} ({back.cause}: {back.message}); " \
           f"{progress}"


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    filled = width if total == 0 else min(width, done * width // total)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def summary(state: Rollout) -> str:
    """The update revision (unless the status is older than the spec), the outcome, steps done/total and the
    detail."""
    what = {Exit.COMPLETE: "complete", Exit.FAILED: "FAILED", Exit.IN_PROGRESS: "in progress"}[state.outcome]
    if state.outcome is Exit.IN_PROGRESS and state.detail.startswith("Paused:"):
        what = "PAUSED"
    of = f"revision {state.revision} " if state.revision else ""
    return f"{of}{what}: {state.done}/{state.total} groups verified; {state.detail}"


def rollout_line(pool: Mapping[str, Any], state: Rollout, *, tty: bool) -> str:
    """`pdfleet rollout status`: one line per state, led by a progress bar on a terminal."""
    line = f"pool {name_of(pool)}: rollout {'of ' if state.revision else ''}{summary(state)}"
    return f"{bar(state.done, state.total)} {line}" if tty else line


def age(moment: datetime.datetime | None, now: datetime.datetime) -> str:
    """kubectl's short age: 42s, 5m, 3h, 2d."""
    if moment is None:
        return "?"
    seconds = max(0, int((now - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _event_time(event: Mapping[str, Any]) -> datetime.datetime | None:
    series = (event.get("series") or {}).get("lastObservedTime")
    for value in (series, event.get("lastTimestamp"), event.get("eventTime"), event.get("firstTimestamp"),
                  (event.get("metadata") or {}).get("creationTimestamp")):
        moment = parse_time(value)
        if moment is not None:
            return moment
    return None


def last_incident(pool: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest Warning Event about this pool (this very object: a same-named predecessor's are left out)."""
    uid = (pool.get("metadata") or {}).get("uid")
    mine = [e for e in events if e.get("type") == "Warning"
            and (e.get("involvedObject") or {}).get("kind") == "InferencePool"
            and (uid is None or (e.get("involvedObject") or {}).get("uid") in (None, uid))]
    epoch = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    return max(mine, key=lambda e: _event_time(e) or epoch, default=None)


def newest_evidence(configmaps: Sequence[Mapping[str, Any]]) -> str | None:
    """The name of the newest evidence ConfigMap (by the capture time the operator annotates it with)."""
    epoch = datetime.datetime.min.replace(tzinfo=datetime.UTC)

    def taken(cm: Mapping[str, Any]) -> datetime.datetime:
        meta = cm.get("metadata") or {}
        return parse_time((meta.get("annotations") or {}).get(EVIDENCE_TIME)) or \
            parse_time(meta.get("creationTimestamp")) or epoch
    newest = max(configmaps, key=taken, default=None)
    return newest["metadata"]["name"] if newest is not None else None


def role_revisions(pool: Mapping[str, Any], status: InferencePoolStatus) -> dict[Role, str]:
    """The revision each role's groups should run, from the spec as the operator computes it; {} when that
    cannot be trusted: a spec that does not validate, or whose pool revision is not the status's (a spec the
    operator has not handled yet, or an operator of another version)."""
    spec, problems = patch_set.validated(pool)
    if spec is None or problems or revision.pool_revision(spec) != status.update_revision:
        return {}
    return {role: revision.role_revision(spec, role) for role in Role}


def _verification(group: GroupStatus) -> str:
    """'yes', or the gate the group is stopped at or waits on, or '-' while nothing was judged at its revision."""
    if _verified(group):
        return "yes"
    if group.verification is None or group.verification.revision != group.revision:
        return "-"
    for state in (GateState.FAILED, GateState.TIMED_OUT, GateState.WAITING):
        gate = next((g for g in group.verification.gates if g.state is state), None)
        if gate is not None:
            return f"{state.lower().replace('timedout', 'timed out')}: {gate.name}"
    return "-"


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def scale_target_line(pool: Mapping[str, Any], role: Role, targets: Sequence[Mapping[str, Any]]) -> str | None:
    """A role's InferencePoolRole, when the role is a scale target: what it asks and what the operator said."""
    if not ((pool.get("spec") or {}).get(str(role)) or {}).get("scaleTarget"):
        return None
    found = next((t for t in targets if (t.get("spec") or {}).get("role") == str(role)), None)
    if found is None:
        return "  scale target: its InferencePoolRole is not there yet"
    status = found.get("status") or {}
    said = f"; {status['message']}" if status.get("message") else ""
    return (f"  scale target: InferencePoolRole {found['metadata']['name']} asks {found['spec']['replicas']} "
            f"group(s){said}")


def autoscaling_line(pool: Mapping[str, Any], role: Role, status: InferencePoolStatus,
                     now: datetime.datetime) -> str | None:
    """A role spec.autoscaling sizes: its bounds, what the autoscaler last decided and why, when it last scaled."""
    spec = (((pool.get("spec") or {}).get("autoscaling") or {}).get(str(role))) or None
    if spec is None:
        return None
    bounds = f"{spec.get('minReplicas', 1)} to {spec['maxReplicas']} group(s)"
    decided = status.autoscaling.role(role) if status.autoscaling is not None else None
    if decided is None:
        return f"  autoscaling: {bounds}; no decision yet"
    scaled = f", last scaled {age(decided.last_scale_time, now)} ago" if decided.last_scale_time else ""
    said = decided.message or f"wants {decided.desired} ({decided.rule})"  # the message starts with the numbers
    return f"  autoscaling: {bounds}, {decided.current} serving{scaled}: {said}"


def band_line(pool: Mapping[str, Any]) -> str | None:
    ratio = ((pool.get("spec") or {}).get("scaling") or {}).get("ratio")
    if not ratio:
        return None
    return (f"Ratio band: {ratio['minDecodePerPrefill']} to {ratio['maxDecodePerPrefill']} decode group(s) per "
            f"prefill group, a scale outside it: {ratio.get('onScale', 'Follow')}")


def patches_line(status: InferencePoolStatus) -> str:
    """The patches the engines run, and the recommended ones they run without and why."""
    record = status.patches
    if record is None:
        return "Patches:    not resolved yet"
    line = f"Patches:    {', '.join(record.effective) or 'none'} ({record.policy})"
    if record.opted_out:
        line += f"; opted out of recommended {', '.join(record.opted_out)}"
    if record.held:
        line += f"; recommended {', '.join(record.held)} held until the next engine-shaping change"
    return line


def status_lines(pool: Mapping[str, Any], *, pods: Sequence[Body] = (), events: Sequence[Mapping[str, Any]] = (),
                 evidence: Sequence[Mapping[str, Any]] = (), scale_targets: Sequence[Mapping[str, Any]] = (),
                 now: datetime.datetime) -> list[str]:
    """`pdfleet status`: phase, revisions, the patches the engines run, per role its groups (and its
    InferencePoolRole when it is a scale target, its autoscaler's last decision when spec.autoscaling sizes it),
    the conditions that are not fine, and the last incident. `pods` give each group's Ready pods (the status has
    no per-group readiness)."""
    status = read_status(pool)
    state = rollout(pool)
    current = status.current_revision or "-"
    revisions = f"current {current}, update {status.update_revision or '-'}"
    lines = [f"Pool:       {name_of(pool)}", f"Phase:      {status.phase}", f"Revision:   {revisions}",
             f"Undo to:    {undo_label(pool)}", f"Rollout:    {summary(state)}", patches_line(status)]
    back = rollback.latest_rollback(pool)
    if back is not None:
        lines.append(f"Rolled back: {age(parse_time(back.at), now)} ago from revision {back.from_revision} to "
                     f"{back.to_revision} ({back.cause}: {back.message})")
    by_group = pods_by_group(list(pods))
    wanted = role_revisions(pool, status)
    if (band := band_line(pool)) is not None:
        lines.append(band)
    for role in Role:
        counts = status.prefill if role is Role.PREFILL else status.decode
        extra = f", {counts.surge} surge group(s) above replicas (maxSurge)" if counts.surge else ""
        lines.append(f"{role.capitalize()}: {counts.ready}/{counts.desired} ready, {counts.updated} updated "
                     f"(verified at the update revision){extra}")
        if (target := scale_target_line(pool, role, scale_targets)) is not None:
            lines.append(target)
        if (autoscaled := autoscaling_line(pool, role, status, now)) is not None:
            lines.append(autoscaled)
        groups = [g for g in status.groups if g.role is role]
        if not groups:
            lines.append("  (no groups)")
            continue
        rows = [("GROUP", "REVISION", "VERDICT", "READY", "VERIFIED", "RESTARTS")]
        for g in groups:
            mine = [p for p in by_group.get(g.name, []) if not p["metadata"].get("deletionTimestamp")]
            ready = f"{sum(pod_ready(p) for p in mine)}/{len(mine)}" if pods else "?"
            restarts = str(g.restarts) + (f" ({g.restart_cause}, budget spent)" if g.budget_exhausted else "")
            outdated = role in wanted and g.revision != wanted[role]
            rows.append((g.name, g.revision + (" (outdated)" if outdated else ""), str(g.verdict), ready,
                         _verification(g), restarts))
        lines.extend(_table(rows))
    bad = [c for c in status.conditions if (c.type, c.status) not in FINE]
    lines.append("Conditions: none yet" if not status.conditions else "Conditions: all fine" if not bad else
                 "Conditions not fine:")
    lines.extend(f"  {c.type}={c.status} {c.reason}: {c.message}" for c in bad)
    incident = last_incident(pool, events)
    if incident is None:
        lines.append("Last incident: none (no Warning Event)")
    else:
        lines.append(f"Last incident: {age(_event_time(incident), now)} ago {incident.get('reason')}: "
                     f"{incident.get('message', '')}")
    newest = newest_evidence(evidence)
    lines.append(f"Evidence:   {newest or 'none'}")
    return lines


def history_lines(pool: Mapping[str, Any]) -> list[str]:
    """`pdfleet rollout history`: the verified revisions recorded, oldest first, and which the pool runs now."""
    entries = rollback.history(pool)
    if not entries:
        return [f"InferencePool {name_of(pool)} has no verified revision recorded: it never completed a verified "
                "rollout"]
    current = read_status(pool).current_revision
    rows = [("REVISION", "VERIFIED AT", "GENERATION", "")]
    rows += [(e.revision, e.at or "-", "-" if e.generation is None else str(e.generation),
              "current" if e.revision == current else "") for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows]


def undo_label(pool: Mapping[str, Any], to_revision: str | None = None) -> str:
    """Where `pdfleet rollout undo` would go, as `status` and `undo` say it."""
    last = rollback.recorded(pool)
    try:
        target = rollback.undo_target(pool, to_revision)
    except rollback.NothingToUndo:
        return f"none (revision {last.revision}, the last verified, runs now)" if last else "none recorded"
    verified = "the last verified" if last is not None and last.revision == target.revision else \
        f"verified {target.at or 'earlier'}"
    return f"revision {target.revision} ({verified})"
