"""Which outdated engine groups a rollout replaces now. Pure: (policy, the groups as observed, now judged) -> Step.

Roles go one after the other in `rollout.order`: a later role keeps its old groups while any group of an earlier
role is outdated or out of service. Within a role, a group counts against `maxUnavailable` while it is out of
service: starting, missing, terminating, failed, or Ready but not yet verified (its gates and bake). The first
group of a role on the new revision is its canary: until one group of the role is verified, at most one is out of
service for the rollout. A stopped rollout (a gate, bake or watch failed) or a paused one replaces nothing.

`reconcile` turns the step into deletions (the replacement comes from recreating the missing group) and Events;
`tests/unit/test_rollout_steps.py` walks whole rollouts through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.rollout import RolloutOrder, RolloutSpec
from pdfleet.operator.planning.groups import GroupState

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


def step(policy: RolloutSpec, groups: Sequence[Group], *, stopped: bool) -> Step:
    """The groups to replace now. `stopped`: the rollout failed (a gate, bake or watch) and holds."""
    replace: list[str] = []
    earlier = False  # an earlier role still rolling out: later roles keep their old groups
    for role in order(policy):
        mine = [g for g in groups if g.role is role]
        outdated = [g for g in mine if g.state is GroupState.OUTDATED]
        busy = sum(g.out_of_service for g in mine)
        budget = max_unavailable(policy, role) - busy
        if outdated and not any(g.verified for g in mine):
            budget = min(budget, 1 - busy)  # the role's canary goes alone
        if stopped or policy.paused or earlier:
            budget = 0
        replace.extend(g.name for g in outdated[:max(0, budget)])
        earlier = earlier or bool(outdated) or busy > 0
    return Step(tuple(replace))
