"""Where a role's engine pods go relative to each other and to the other role (`scheduling.spread`,
`scheduling.near`): a topologySpreadConstraint and a preferred pod-affinity term, both carried out by
kube-scheduler. Pure; with neither set the pod has what it always had (no rollout for any existing pool).
"""

from __future__ import annotations

import copy
from typing import Any

from pdfleet.operator.api.role_name import Role
from pdfleet.operator.api.scheduling import EngineScheduling, Near, Spread, TopologyMode
from pdfleet.operator.render import labels

Body = dict[str, Any]

_WHEN_UNSATISFIABLE = {TopologyMode.PREFERRED: "ScheduleAnyway", TopologyMode.REQUIRED: "DoNotSchedule"}
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def spread_constraints(pool: str, role: Role, spread: Spread | None) -> list[Body]:
    """The role's spread over the domains of `spread.node_label`, counted by the groups' first pods. Every pod of
    the role carries it, so that a group's pods keep one scheduling shape (Kueue splits a group into pod sets by
    it); a pod of a later node rank does not match the selector, so it adds nothing to the count."""
    if spread is None:
        return []
    return [{
        "maxSkew": 1,
        "topologyKey": spread.node_label,
        "whenUnsatisfiable": _WHEN_UNSATISFIABLE[spread.mode],
        "labelSelector": {"matchLabels": labels.selector(pool, **{labels.ROLE: str(role), labels.RANK: "0"})},
        # Each revision's groups spread among themselves, as a Deployment's ReplicaSets do by pod-template-hash:
        # during a rollout the old groups that are about to go do not push the new ones into a crowded domain.
        "matchLabelKeys": [labels.REVISION],
        # A node the pods cannot go to for a taint (another team's GPUs) is not a domain: counted with none of the
        # role's groups, it would hold every Required spread at a skew it can never reduce.
        "nodeTaintsPolicy": "Honor",
    }]


def near_term(pool: str, near: Near) -> Body:
    return {"weight": near.weight, "podAffinityTerm": {
        "labelSelector": {"matchLabels": labels.selector(pool, **{labels.ROLE: str(near.role)})},
        "topologyKey": near.node_label,
    }}


def affinity(pool: str, scheduling: EngineScheduling) -> Body | None:
    """The pod's affinity: the user's own (`scheduling.affinity`), with the `near` preference appended to its
    preferred pod-affinity terms. The spec is never changed: it is frozen and shared by every render of the pool."""
    if scheduling.near is None:
        return scheduling.affinity or None
    out = copy.deepcopy(scheduling.affinity) if scheduling.affinity else {}
    pod_affinity = out.setdefault("podAffinity", {})
    pod_affinity[_PREFERRED] = [*(pod_affinity.get(_PREFERRED) or []), near_term(pool, scheduling.near)]
    return out
