"""Which engine groups of a role count as serving capacity for `spec.autoscaling`. Pure.

A group counts only when every one of its pods is Ready and not terminating, its ranks were judged Healthy in
this poll, and it runs the role's revision and passed verification at it (`status.groups[].verifiedRevision`): a
starting group, a sick one, one being replaced and a canary still baking carry no load the role can be sized on
(and a rollout's old groups are about to go). A role is all serving when exactly `replicas` groups of it exist
and every one counts: no scale-down is decided otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.status import GroupStatus, Verdict
from pdfleet.operator.planning.health import rank_health
from pdfleet.operator.render import labels

Body = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Serving:
    groups: tuple[str, ...]  # names of the groups that count, sorted
    all_serving: bool


def _revisions(pods: Sequence[Body]) -> set[str | None]:
    return {(p["metadata"].get("labels") or {}).get(labels.REVISION) for p in pods}


def serving(role: Role, *, replicas: int, nodes: int, revision: str, pods: Mapping[str, Sequence[Body]],
            verdicts: Mapping[str, Verdict], statuses: Sequence[GroupStatus]) -> Serving:
    """`pods`: the pool's pods by group name; `verdicts`: this poll's, by group; `statuses`: the pool's status
    groups (for what was verified)."""
    verified = {g.name: g.verified_revision for g in statuses if g.role is role}
    mine = {name: group for name, group in pods.items()
            if any((p["metadata"].get("labels") or {}).get(labels.ROLE) == str(role) for p in group)}
    counted = sorted(
        name for name, group in mine.items()
        if rank_health.pollable(group, nodes=nodes) and not rank_health.terminating(group)
        and verdicts.get(name) is Verdict.HEALTHY and _revisions(group) == {revision}
        and verified.get(name) == revision)
    return Serving(groups=tuple(counted), all_serving=len(mine) == replicas and len(counted) == replicas)
