"""A rollout's decisions, pure: which outdated engine groups to replace now (`step`), and where the rollout
stands and what follows (`judge`: RolloutVerified from the groups' gates and bakes, the post-rollout watch, and
rollback or hold).

`surge`: (policy, the groups as observed) -> how many groups above `replicas` each role should have now.
`step`: (policy, the groups as observed, now judged) -> Step.

Roles go one after the other in `rollout.order`: a later role keeps its old groups (and gets no surge group)
while any group of an earlier role is outdated or out of service. The first group of a role on the new revision
is its canary: until one group of the role is verified, at most one is out of service for the rollout, and at
most one surge group exists. Within a role:
- without `maxSurge` (or once its surge group could not be scheduled), a group counts against `maxUnavailable`
  while it is out of service: starting, missing, terminating, failed, or Ready but not yet verified (its gates
  and bake); outdated groups are replaced in place;
- with `maxSurge`, up to that many groups of the new revision are started above `replicas` first (the canary
  among them), and an old group is deleted only while the groups that serve (verified, or outdated) stay at
  least `replicas`. The surge groups go once no group below `replicas` waits to be verified.
A stopped rollout (a gate, bake or watch failed) or a paused one replaces nothing and keeps its surge groups.

`reconcile` turns the step into deletions (the replacement comes from recreating the missing group) and Events,
and the judgement into the status's conditions, a patch of the pool (a rollback, the verified record) and
Events; `tests/unit/test_rollout_steps.py` walks whole rollouts through the step, `tests/unit/test_bake.py` through
both, with the real planner.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence, Set
from typing import Any

from pdfleet.operator.api.conditions import ConditionStatus
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.rollout import RolloutOrder, RolloutSpec
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import GroupStatus, InferencePoolStatus
from pdfleet.operator.planning.groups import GroupState
from pdfleet.operator.planning.rollout import rollback, verification, watch
from pdfleet.operator.planning.rollout.verification import Outcome, RolloutVerified
from pdfleet.operator.render import revision
from pdfleet.operator.render.desired import DesiredGroup

# States in which a group does not serve (and so counts against maxUnavailable).
UNAVAILABLE = frozenset({GroupState.MISSING, GroupState.PARTIAL, GroupState.STARTING, GroupState.TERMINATING,
                         GroupState.FAILED})


@dataclasses.dataclass(frozen=True)
class Group:
    """What the rollout needs of one engine group."""

    name: str
    role: Role
    state: GroupState
    verified: bool  # its pods run the revision they should, verified (gates and bake passed)
    surge: bool = False  # above `replicas`: started for a rollout's maxSurge

    @property
    def out_of_service(self) -> bool:
        return self.state in UNAVAILABLE or (self.state is GroupState.READY and not self.verified)


@dataclasses.dataclass(frozen=True)
class Step:
    replace: tuple[str, ...] = ()  # outdated groups to replace now, in order


def order(policy: RolloutSpec) -> list[Role]:
    return [Role.DECODE, Role.PREFILL] if policy.order is RolloutOrder.DECODE_FIRST else [Role.PREFILL, Role.DECODE]


def max_unavailable(policy: RolloutSpec, role: Role) -> int:
    return policy.max_unavailable.prefill if role is Role.PREFILL else policy.max_unavailable.decode


def max_surge(policy: RolloutSpec, role: Role) -> int:
    return policy.max_surge.prefill if role is Role.PREFILL else policy.max_surge.decode


_GONE = frozenset({GroupState.MISSING, GroupState.TERMINATING})


def _rolling(groups: Sequence[Group]) -> bool:
    """A role's groups are still rolling out: outdated, or out of service (later roles wait for them)."""
    return any(g.state is GroupState.OUTDATED or g.out_of_service for g in groups)


def surge(policy: RolloutSpec, groups: Sequence[Group], *, stopped: bool,
          unschedulable: Set[Role] = frozenset()) -> dict[Role, int]:
    """How many surge groups each role should have now (those above it are deleted, those missing created).
    `groups`: every group of the pool, every surge slot among them (missing or not); `unschedulable`: roles whose surge
    group could not be scheduled in this rollout (they replace in place)."""
    wanted: dict[Role, int] = {}
    earlier = False
    for role in order(policy):
        mine = [g for g in groups if g.role is role and not g.surge]
        # The surge groups there are and stay: one not created yet, or on its way out, neither holds the role
        # in its rollout nor, once the role is done, the next role from its own (it would be deleted and made
        # again while the last one terminates).
        extra = [g for g in groups if g.role is role and g.surge and g.state not in _GONE]
        limit = 0 if role in unschedulable else max_surge(policy, role)
        rolling = any(g.state is GroupState.OUTDATED for g in mine) or bool(extra)
        count = min(limit, sum(not g.verified for g in mine)) if rolling and not earlier else 0
        if not any(g.verified for g in mine + extra):
            count = min(count, 1)  # the canary alone
        if stopped or policy.paused:
            count = len(extra)  # held as it is: nothing started, nothing taken away
        wanted[role] = count
        earlier = earlier or _rolling(mine + extra)
    return wanted


def step(policy: RolloutSpec, groups: Sequence[Group], *, stopped: bool,
         unschedulable: Set[Role] = frozenset()) -> Step:
    """The groups to replace now. `stopped`: the rollout failed (a gate, bake or watch) and holds;
    `unschedulable`: roles whose surge group could not be scheduled (they fall back to maxUnavailable)."""
    replace: list[str] = []
    earlier = False  # an earlier role still rolling out: later roles keep their old groups
    for role in order(policy):
        mine = [g for g in groups if g.role is role]
        outdated = [g for g in mine if g.state is GroupState.OUTDATED]
        busy = sum(g.out_of_service for g in mine)
        if max_surge(policy, role) and role not in unschedulable:
            # Capacity never drops: an old group goes only while the others serve at least `replicas`.
            budget = sum(not g.out_of_service for g in mine) - sum(not g.surge for g in mine)
        else:
            budget = max_unavailable(policy, role) - busy
        if outdated and not any(g.verified for g in mine):
            budget = min(budget, 1 - busy)  # the role's canary goes alone
        if stopped or policy.paused or earlier:
            budget = 0
        replace.extend(g.name for g in outdated[:max(0, budget)])
        earlier = earlier or _rolling(mine)
    return Step(tuple(replace))


@dataclasses.dataclass(frozen=True)
class Judged:
    update: str  # the revision the spec asks for
    condition: RolloutVerified  # RolloutVerified after the watch, with what follows in its message
    settled: bool  # every group Ready and verified at the update revision (the watch may still run)
    watched: watch.Watched
    decision: rollback.Decision  # hold, wait, or roll back (its patch and Event)


def judge(pool: Mapping[str, Any], spec: InferencePoolSpec, groups: Sequence[DesiredGroup],
          states: Mapping[str, GroupState], outcomes: Mapping[str, Outcome], previous: InferencePoolStatus,
          statuses: Mapping[str, GroupStatus], now: datetime.datetime, *, router_ok: bool) -> Judged:
    """Where the rollout stands after this reconcile. `groups`: as desired; `statuses`: each group's status after
    this reconcile's health decisions, by name; `previous`: the pool's last status."""
    update = revision.pool_revision(spec)
    ranked = order(spec.rollout)
    # In rollout order, so that the group a message says it waits for is the one being replaced.
    verified = verification.rollout_verified(sorted(groups, key=lambda g: ranked.index(g.id.role)), outcomes,
                                             update)
    settled = all(s is GroupState.READY for s in states.values()) and router_ok and \
        verified.status is ConditionStatus.TRUE
    watched = watch.judge(
        duration=parse_duration(spec.rollout.post_rollout_watch), previous=previous.watch,
        active=previous.current_revision is not None and
        update not in {e.revision for e in rollback.history(pool)},
        completing=settled and previous.current_revision != update, verified=verified,
        failure=watch.failing((statuses[g.name], g.revision, states[g.name] is GroupState.FAILED) for g in groups),
        update=update, now=now, auto_rollback=spec.rollout.auto_rollback)
    decision = rollback.decide(pool, spec, previous, watched.rollout, now)
    condition = watched.rollout if not decision.note else \
        dataclasses.replace(watched.rollout, message=f"{watched.rollout.message}; {decision.note}")
    return Judged(update, condition, settled, watched, decision)
