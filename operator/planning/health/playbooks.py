"""Playbooks: spec changes the operator makes on its own for an incident it recognises (`spec.rollout.playbooks`).
Pure: decisions and patches (`spec_change.SpecChange`); the executor sends them after the status.

The overlap-desync playbook (`overlapDesync.action: DisableOverlapSchedule`): the reconcile that restarts a group
for a Desync while its ranks ran an overlap event loop (`event_loop_overlap_disagg_*`: the loop whose triggers
cause TP-collective desyncs) also patches `spec.engine.overlapSchedule` to Disabled, and nothing else. The new
spec rolls out like any other, every group verified on the normal loop. Why is recorded next to it, in the
annotation `pdfleet.dev/playbook-overlap-desync` (when, which group, its loop, the evidence ConfigMap), in the
same patch, guarded by the pool's generation: a plan made twice patches once.

At most once per pool: while the annotation is there the playbook does not fire again. A spec that sets
overlapSchedule back (a GitOps tool re-applying what is in git, a person) is left as it says, never flipped
again: no tug of war. The disagreement is said once, by a Warning `PlaybookOverlapDesyncReverted`, and written
into the annotation (`reverted`, the generation it was seen at) so that an operator restarted later does not
say it again. A person re-arms the playbook by removing the annotation.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from pdfleet.operator.api.engine import Switch
from pdfleet.operator.api.rollout import OverlapDesyncAction
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import GroupStatus, RestartCause, Verdict
from pdfleet.operator.planning import spec_change
from pdfleet.operator.planning.health import restarts
from pdfleet.operator.planning.plan import Event, Restart
from pdfleet.operator.planning.rollout import rollback
from pdfleet.operator.planning.spec_change import SpecChange
from pdfleet.operator.render import labels

Body = dict[str, Any]
OVERLAP_DESYNC = f"{labels.PREFIX}/playbook-overlap-desync"
OVERLAP_LOOP = "event_loop_overlap_disagg_"
OVERLAP_SCHEDULE: spec_change.Path = ("spec", "engine", "overlapSchedule")


class OverlapDesyncRecord(BaseModel):
    """The content of `pdfleet.dev/playbook-overlap-desync`: when and why the playbook fired."""

    at: str
    group: str
    event_loop: str
    evidence: str | None  # the evidence ConfigMap of the Desync (None: evidence capture is disabled)
    generation: int | None  # the generation the patch produced (the spec with overlapSchedule: Disabled)
    reverted: int | None = None  # the generation at which a spec setting overlapSchedule back was first seen


@dataclasses.dataclass(frozen=True)
class Decision:
    """A patch of the pool, and the Event saying why (about the pool: not posted if the patch is refused)."""

    change: SpecChange
    event: Event


def _meta(pool: Mapping[str, Any]) -> Mapping[str, Any]:
    return pool.get("metadata") or {}


def fired(pool: Mapping[str, Any]) -> OverlapDesyncRecord | None:
    """The playbook's record on the pool; None when it has not fired (or a person removed the record)."""
    return spec_change.annotation_record(pool, OVERLAP_DESYNC, OverlapDesyncRecord)


def armed(pool: Mapping[str, Any]) -> bool:
    """The annotation is absent: the playbook may fire. One this pdfleet cannot read still counts as fired."""
    return spec_change.annotation(pool, OVERLAP_DESYNC) is None


def decide(pool: Mapping[str, Any], spec: InferencePoolSpec, groups: Sequence[GroupStatus],
           restarted: Sequence[Restart], configmaps: Sequence[Body], now: datetime.datetime, *,
           spec_changing: bool = False) -> Decision | None:
    """What the overlap-desync playbook does in this reconcile. `groups`: the groups' new status (a group restarted
    here still shows the loop its ranks ran); `restarted`: the groups this plan restarts, with why;
    `spec_changing`: another change of this plan patches the spec (a rollback), and a second one would be refused.
    None: nothing to do."""
    if spec.rollout.playbooks.overlap_desync.action is OverlapDesyncAction.NONE:
        return None
    disabled = spec.engine.overlap_schedule is Switch.DISABLED
    if not armed(pool):
        record = fired(pool)
        if record is None or record.reverted is not None or disabled:
            return None
        return _reverted(pool, spec, record)
    if disabled or spec_changing:
        return None
    by_name = {g.name: g for g in groups}
    sick = sorted(r.group for r in restarted if r.cause == RestartCause.DESYNC and r.group in by_name
                  and (by_name[r.group].event_loop or "").startswith(OVERLAP_LOOP))
    if not sick:
        return None
    group = by_name[sick[0]]
    evidence = _evidence(spec, configmaps, group.name)
    generation = _meta(pool).get("generation")
    record = OverlapDesyncRecord(at=now.strftime("%Y-%m-%dT%H:%M:%SZ"), group=group.name,
                                 event_loop=group.event_loop or "", evidence=evidence,
                                 generation=None if generation is None else generation + 1)
    where = f"evidence in ConfigMap {evidence}" if evidence else "evidence capture disabled"
    change = spec_change.patch(pool, {OVERLAP_SCHEDULE: str(Switch.DISABLED)},
                               annotations={OVERLAP_DESYNC: record.model_dump_json()},
                               why=f"overlap-desync playbook: overlapSchedule Disabled after a Desync of {group.name}")
    assert change is not None, "overlapSchedule is not Disabled yet: the patch changes it"
    message = (f"overlap-desync playbook: {group.role} group {group.name} desynced on {group.event_loop} "
               f"({where}); restarted it and set spec.engine.overlapSchedule to Disabled, rolling out to the "
               f"normal loop with verification. Done once for this pool: annotation {OVERLAP_DESYNC} records "
               f"it; remove the annotation to re-arm the playbook. GitOps: commit overlapSchedule: Disabled")
    return Decision(change, Event("Warning", "PlaybookOverlapDesync", message, about=_about(pool)))


def _evidence(spec: InferencePoolSpec, configmaps: Sequence[Body], group: str) -> str | None:
    """The evidence ConfigMap of the group's Desync: its newest Desync bundle (the restart that comes with the
    playbook waited for it: `restarts.decide` captures before it restarts)."""
    if not restarts.evidence_enabled(spec.health):
        return None
    desyncs = [cm for _, cm in restarts.evidence_of(configmaps, group)
               if (cm["metadata"].get("annotations") or {}).get(restarts.EVIDENCE_VERDICT) == Verdict.DESYNC]
    return desyncs[-1]["metadata"]["name"] if desyncs else None


def _reverted(pool: Mapping[str, Any], spec: InferencePoolSpec, record: OverlapDesyncRecord) -> Decision:
    """The spec no longer says what the playbook set: leave it, and say so once (recorded in the annotation)."""
    generation = _meta(pool).get("generation")
    by = "by the operator's autoRollback (pdfleet.dev/rolled-back)" if rollback.rolled_back(pool) is not None \
        else "by someone (a GitOps tool re-applying an older spec?)"
    update = record.model_copy(update={"reverted": generation})
    change = spec_change.patch(pool, {}, annotations={OVERLAP_DESYNC: update.model_dump_json()},
                               why="overlap-desync playbook: its change was reverted; said once")
    assert change is not None, "the record gains `reverted`: the patch changes it"
    where = f", evidence in ConfigMap {record.evidence}" if record.evidence else ""
    message = (f"spec.engine.overlapSchedule is {spec.engine.overlap_schedule} again at generation {generation}, "
               f"reverted {by}: the overlap-desync playbook set it to Disabled at {record.at} after a Desync of "
               f"group {record.group}{where}. The operator leaves the spec as it is and will not handle overlap "
               f"desyncs automatically again until the annotation {OVERLAP_DESYNC} is removed; to keep the fix, "
               f"commit overlapSchedule: Disabled to git")
    return Decision(change, Event("Warning", "PlaybookOverlapDesyncReverted", message, about=_about(pool)))


def _about(pool: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The Event is about the pool's patch: not posted if the patch is refused (the spec moved on)."""
    return (("InferencePool", str(_meta(pool).get("name", ""))),)
