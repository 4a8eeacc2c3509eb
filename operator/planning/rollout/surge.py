"""A rollout's surge groups (`rollout.maxSurge`) between rendering and the rollout's step. Pure.

A surge group is an engine group above its role's `replicas`, at the ordinals right above its kept groups'
(`ordinals.slots`); it exists only while a rollout of its role needs it (`rollout.surge` decides how many). The
planner renders every slot such a group may take (those that exist, or maxSurge), so that each is classified and
verified like any group, then keeps the slots the decision wants (`kept`); a surge group left out is deleted as
past `replicas`.

A surge group the scheduler cannot place (no node with free GPUs), or whose gang Kueue holds for want of quota or
of a topology domain with room (`gang_wait.no_room`), would hold the rollout for good: the role falls back to
replacing in place, up to `maxUnavailable` (`unschedulable`). A gang Kueue holds for another reason (no such
queue) does not: replacing in place would only turn serving groups into more groups Kueue holds. The fallback
is remembered in the role's status for the update revision, so that the next reconcile does not start another
one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set
from typing import Any

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import InferencePoolStatus
from pdfleet.operator.planning.plan import Event
from pdfleet.operator.planning.rollout import rollout_plan
from pdfleet.operator.planning.scale import gang_wait
from pdfleet.operator.render.desired import Desired

Body = dict[str, Any]
UNSCHEDULABLE_REASON = "RolloutSurgeUnschedulable"


def kept(spec: InferencePoolSpec, want: Desired, counts: Mapping[Role, int]) -> Desired:
    """`want` with only the surge groups the rollout wants now (`counts` per role): the lowest slots."""
    keep: set[str] = set()
    for role in Role:
        slots = sorted((g for g in want.groups if g.id.role is role and g.surge), key=lambda g: g.id.index)
        keep.update(g.name for g in slots[:counts.get(role, 0)])
    return dataclasses.replace(want, groups=tuple(g for g in want.groups if not g.surge or g.name in keep))


def removed(spec: InferencePoolSpec, slots: Desired, kept: Set[str], previous: InferencePoolStatus) -> set[str]:
    """The surge groups that go now (not those a scale-down leaves past replicas)."""
    return {g.name for g in slots.groups if g.name not in kept and _of_a_rollout(spec, g.id.role, previous)}


def _of_a_rollout(spec: InferencePoolSpec, role: Role, previous: InferencePoolStatus) -> bool:
    """Whether groups of `role` in the slots past replicas are a rollout's surge groups: not while the role scales,
    when they are the groups a scale-down leaves (one Kueue still holds was once taken for a surge gang with no
    room, and said so in a RolloutSurgeUnschedulable Warning with no rollout at all)."""
    return spec.role(role).replicas == previous.role(role).desired


def unschedulable(spec: InferencePoolSpec, want: Desired, pods: Mapping[str, list[Body]],
                  previous: InferencePoolStatus, update: str,
                  gang_reasons: Mapping[str, str] | None = None) -> tuple[set[Role], list[Event]]:
    """The roles whose rollout to `update` falls back to maxUnavailable, and a Warning for each that does so now.
    `gang_reasons`: Kueue's reason for each gang it holds, by Kueue group name (`gang_wait`)."""
    held = {role for role in Role if previous.role(role).surge_unschedulable == update}
    events: list[Event] = []
    for group in want.groups:
        role = group.id.role
        if role in held or not group.surge or not _of_a_rollout(spec, role, previous):
            continue
        if (why := gang_wait.unscheduled(pods.get(group.name, []))) is not None:
            said = f"could not be scheduled ({why})"
        elif (why := gang_wait.no_room(pods.get(group.name, []), gang_reasons or {})) is not None:
            said = f"is held by Kueue, which has no room for its gang ({why})"
        else:
            continue
        held.add(role)
        events.append(Event(
            "Warning", UNSCHEDULABLE_REASON,
            f"maxSurge: {role} group {group.name} of revision {group.revision} {said}; it "
            f"is deleted, and this rollout replaces {role} groups in place, up to maxUnavailable "
            f"{rollout_plan.max_unavailable(spec.rollout, role)} at a time"))
    return held, events
