"""The last verified revision, kept on the pool, and going back to it. Pure: decisions and patches
(`spec_change.SpecChange`); the executor sends them.

The record is an annotation on the pool, `pdfleet.dev/verified-spec`: the engine-shaping part of the spec (model,
engine, transfer, each role's section but its replicas: exactly what `render.revision` hashes) as JSON, with its
revision, written once RolloutVerified is True at the spec's revision: every group passed verification (its bake
included) and the revision passed its post-rollout watch (`watch`). It lives in
the cluster, next to the spec it can restore, so an operator restarted at any moment (or another replica taking
the lease) finds it; nothing of it is kept in memory.

Every verified revision is also kept, newest last, in `pdfleet.dev/verified-history` (the last `HISTORY_LIMIT`,
each with its spec and when it was verified): `pdfleet rollout history` lists them, and `pdfleet rollout undo`
goes to the newest one that is not the pool's revision now (or, `--to-revision`, to the one named), so a
revision that was verified and then went bad can still be undone.

Going back patches those sections of the spec to the record (`kubectl rollout undo`'s way), and the new spec
rolls out like any other: group by group, each verified. Replicas and every policy (rollout, health, router)
stay as they are. Why the spec changed is recorded next to it, in `pdfleet.dev/rolled-back`, and said by a
Warning Event `RolloutRolledBack`.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from pdfleet.operator.api.conditions import ConditionStatus, ConditionType
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import InferencePoolStatus
from pdfleet.operator.planning import patch_set, spec_change
from pdfleet.operator.planning.plan import Event
from pdfleet.operator.planning.rollout.verification import RolloutVerified
from pdfleet.operator.planning.spec_change import REMOVE, SpecChange
from pdfleet.operator.render import labels, revision

Body = dict[str, Any]
VERIFIED_SPEC = f"{labels.PREFIX}/verified-spec"
VERIFIED_HISTORY = f"{labels.PREFIX}/verified-history"
HISTORY_LIMIT = 10  # each entry holds an engine-shaping spec (a few KB); annotations share 256 KB per object
ROLLED_BACK = f"{labels.PREFIX}/rolled-back"
SHAPING = ("model", "engine", "transfer")  # sections of the spec that shape every engine (render.revision)
ROLES = ("prefill", "decode")
NOT_SHAPING = {"replicas"}  # the one field of a role's section that does not (revision's own exclusion)
UNDO = "Undo"  # the cause `pdfleet rollout undo` records; automatic rollbacks record the gate's reason


class VerifiedSpec(BaseModel):
    """The content of `pdfleet.dev/verified-spec`."""

    revision: str
    generation: int | None = None
    spec: Body


class Verified(VerifiedSpec):
    """One entry of `pdfleet.dev/verified-history`."""

    at: str = ""  # when it was recorded as verified (RFC 3339); "" for a record older than the history


class History(BaseModel):
    """The content of `pdfleet.dev/verified-history`, oldest first."""

    entries: list[Verified]


class RolledBack(BaseModel):
    """The content of `pdfleet.dev/rolled-back`: the last time the spec was patched back, and why."""

    cause: str  # GateFailed, GateTimedOut, or Undo
    from_revision: str
    to_revision: str
    generation: int | None  # the generation the patch produced (the spec it wrote)
    message: str
    at: str


def shaping(spec: Mapping[str, Any]) -> Body:
    """The engine-shaping sections of a spec as stored (wire names)."""
    out: Body = {k: spec[k] for k in SHAPING if k in spec}
    for role in ROLES:
        if role in spec:
            out[role] = {k: v for k, v in spec[role].items() if k not in NOT_SHAPING}
    return json.loads(json.dumps(out))


def recorded(pool: Mapping[str, Any]) -> VerifiedSpec | None:
    """The last verified spec, or None (never verified, or an annotation this pdfleet cannot read)."""
    return spec_change.annotation_record(pool, VERIFIED_SPEC, VerifiedSpec)


def history(pool: Mapping[str, Any]) -> list[Verified]:
    """Every verified revision recorded, oldest first (a pool verified by an older pdfleet: its last one)."""
    found = spec_change.annotation_record(pool, VERIFIED_HISTORY, History)
    if found is not None:
        return list(found.entries)
    last = recorded(pool)
    return [Verified(**last.model_dump())] if last is not None else []


def latest_rollback(pool: Mapping[str, Any]) -> RolledBack | None:
    """The last rollback (or undo) recorded on the pool, however old."""
    return spec_change.annotation_record(pool, ROLLED_BACK, RolledBack)


def rolled_back(pool: Mapping[str, Any]) -> RolledBack | None:
    """The last rollback recorded on the pool, if it produced the spec the pool has now (a later change of the
    spec by anyone makes it history)."""
    record = latest_rollback(pool)
    generation = (pool.get("metadata") or {}).get("generation")
    return record if record is not None and record.generation == generation else None


def record(pool: Mapping[str, Any], status: InferencePoolStatus, now: datetime.datetime) -> SpecChange | None:
    """Records the pool's spec as the last verified one, and at the end of the history, once every group of its
    revision passed verification (RolloutVerified True and currentRevision == updateRevision, at the spec's
    generation); None when the record already says so or the rollout has not completed."""
    generation = (pool.get("metadata") or {}).get("generation")
    verified = next((c for c in status.conditions if c.type == ConditionType.ROLLOUT_VERIFIED), None)
    if verified is None or verified.status is not ConditionStatus.TRUE or status.observed_generation != generation \
            or status.current_revision is None or status.current_revision != status.update_revision:
        return None
    before = recorded(pool)
    if before is not None and before.revision == status.current_revision:
        return None
    entry = Verified(revision=status.current_revision, generation=generation, spec=shaping(pool.get("spec") or {}),
                     at=now.strftime("%Y-%m-%dT%H:%M:%SZ"))
    # A revision verified again (rolled back to) moves to the end: the history is in order of verification.
    entries = [e for e in history(pool) if e.revision != entry.revision] + [entry]
    value = VerifiedSpec(revision=entry.revision, generation=generation, spec=entry.spec).model_dump_json()
    return spec_change.patch(pool, {}, annotations={
        VERIFIED_SPEC: value, VERIFIED_HISTORY: History(entries=entries[-HISTORY_LIMIT:]).model_dump_json()},
        why=f"recorded revision {status.current_revision} as the last verified one")


def restore(pool: Mapping[str, Any], target: VerifiedSpec, *, cause: str, message: str,
            now: datetime.datetime) -> SpecChange | None:
    """The patch that puts the recorded engine-shaping sections back (each role keeps its replicas) and records
    why; None when the spec already has them."""
    spec = pool.get("spec") or {}
    changes: dict[spec_change.Path, Any] = {("spec", k): target.spec.get(k, REMOVE) for k in SHAPING}
    for role in ROLES:
        section = dict(target.spec.get(role) or {})
        for field in NOT_SHAPING:
            if field in (spec.get(role) or {}):
                section[field] = spec[role][field]
        changes[("spec", role)] = section
    if spec_change.patch(pool, changes, why="") is None:
        return None
    generation = (pool.get("metadata") or {}).get("generation")
    why = RolledBack(cause=cause, from_revision=_revision_of(pool) or "?", to_revision=target.revision,
                     generation=None if generation is None else generation + 1, message=message,
                     at=now.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return spec_change.patch(pool, changes, annotations={ROLLED_BACK: why.model_dump_json()},
                             why=f"{cause}: back to revision {target.revision}")


def _revision_of(pool: Mapping[str, Any]) -> str | None:
    spec, _ = patch_set.validated(pool)
    return revision.pool_revision(spec) if spec is not None else None


class Action(enum.StrEnum):
    NONE = "None"  # the rollout did not fail
    HOLD = "Hold"  # it failed, and the pool holds until the spec changes
    WAIT = "Wait"  # it failed and will roll back once the failure is in the status (next reconcile)
    ROLL_BACK = "RollBack"


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    note: str = ""  # appended to the RolloutVerified condition's message: what happens next
    change: SpecChange | None = None
    event: Event | None = None


def decide(pool: Mapping[str, Any], spec: InferencePoolSpec, previous: InferencePoolStatus,
           rollout: RolloutVerified, now: datetime.datetime) -> Decision:
    """What follows a rollout's verification: nothing, hold, or return to the last verified revision.

    The rollback is planned only once the status already says the rollout failed (the same RolloutVerified
    False at this generation), so the failure is on record and announced (RolloutGateFailed) before the spec
    is patched. `rollout.message` is the condition's message without the note."""
    if rollout.status is not ConditionStatus.FALSE:
        return Decision(Action.NONE)
    if not spec.rollout.auto_rollback:
        return Decision(Action.HOLD, "holding until the spec changes (spec.rollout.autoRollback is off)")
    target = recorded(pool)
    update = revision.pool_revision(spec)
    if target is None:
        return Decision(Action.HOLD, "autoRollback: no verified revision to return to (the pool never completed a "
                                     "verified rollout); holding until the spec changes")
    if target.revision == update:
        return Decision(Action.HOLD, f"autoRollback: revision {update} is itself the last verified one, nothing "
                                     f"older is recorded; holding until the spec changes")
    note = f"autoRollback: returning to the last verified revision {target.revision}"
    generation = (pool.get("metadata") or {}).get("generation")
    on_record = any(c.type == ConditionType.ROLLOUT_VERIFIED and c.status is ConditionStatus.FALSE
                    and c.observed_generation == generation and c.message == f"{rollout.message}; {note}"
                    for c in previous.conditions)
    if not on_record:
        return Decision(Action.WAIT, note)
    message = f"rolled back from revision {update} to the last verified revision {target.revision}: " \
              f"{rollout.message}"
    change = restore(pool, target, cause=rollout.reason, message=rollout.message, now=now)
    name = (pool.get("metadata") or {}).get("name", "")
    event = Event("Warning", "RolloutRolledBack", message, about=(("InferencePool", name),))
    return Decision(Action.ROLL_BACK, note, change, event if change is not None else None)


class NothingToUndo(ValueError):
    """`pdfleet rollout undo` has no verified revision to go back to, or the pool already has it."""


def undo_target(pool: Mapping[str, Any], to_revision: str | None = None) -> Verified:
    """Where `pdfleet rollout undo` goes: the revision named, or the newest verified one that the pool does not
    have now. Raises NothingToUndo saying why there is none."""
    meta = pool.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    entries = history(pool)
    if not entries:
        raise NothingToUndo(f"InferencePool {name} has no verified revision recorded (annotation {VERIFIED_SPEC}): "
                            f"it never completed a verified rollout, so there is nothing to go back to")
    current = _revision_of(pool)
    if to_revision is not None:
        target = next((e for e in entries if e.revision == to_revision), None)
        if target is None:
            raise NothingToUndo(f"InferencePool {name} has no verified revision {to_revision} in its history "
                                f"(recorded: {', '.join(e.revision for e in entries)})")
        if target.revision == current:
            raise NothingToUndo(f"InferencePool {name} already has revision {to_revision}: nothing to undo")
        return target
    older = [e for e in entries if e.revision != current]
    if not older:
        raise NothingToUndo(f"InferencePool {name} already has the last verified revision {entries[-1].revision}, "
                            f"and no other verified revision is recorded: nothing to undo")
    return older[-1]


def undo(pool: Mapping[str, Any], now: datetime.datetime, to_revision: str | None = None) -> SpecChange:
    """`pdfleet rollout undo [--to-revision R]`: the patch back to a verified revision (`undo_target`)."""
    target = undo_target(pool, to_revision)
    change = restore(pool, target, cause=UNDO, message="pdfleet rollout undo", now=now)
    if change is None:
        meta = pool.get("metadata") or {}
        raise NothingToUndo(f"InferencePool {meta.get('namespace', '')}/{meta.get('name', '')} already has the "
                            f"engine-shaping spec of revision {target.revision}: nothing to undo")
    return change
