"""Where engine pods may run: node selector, tolerations, affinity, priority."""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule
from pdfleet.operator.api.role_name import Role


class TolerationOperator(enum.StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


_EXISTS_HAS_NO_VALUE = Rule(
    cel="self.operator != 'Exists' || !has(self.value) || self.value == ''",
    holds=lambda t: t.operator != TolerationOperator.EXISTS or not t.value,
    message="a toleration with operator Exists may not set value",
    field=".value",
)


class Toleration(ApiModel):
    """A core/v1 Toleration: lets engine pods onto nodes with a matching taint (GPU nodes often have one)."""

    RULES = (_EXISTS_HAS_NO_VALUE,)

    key: Annotated[str, Field(max_length=316)] | None = Field(
        default=None, description="Taint key; empty with operator Exists matches every taint."
    )
    operator: TolerationOperator = Field(default=TolerationOperator.EQUAL, description="Exists or Equal.")
    value: Annotated[str, Field(max_length=63)] | None = Field(default=None, description="Taint value (Equal).")
    effect: TaintEffect | None = Field(default=None, description="Taint effect to match; empty matches all.")
    toleration_seconds: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="How long a NoExecute taint is tolerated before eviction."
    )


class Scheduling(ApiModel):
    """Pod placement for one role's engine pods."""

    node_selector: dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=32, description="Node labels an engine pod's node must have."
    )
    tolerations: tuple[Toleration, ...] = Field(
        default=(), max_length=32, description="Taints engine pods tolerate.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="A core/v1 Affinity, passed to the pods unchanged (nodeAffinity, podAntiAffinity, ...).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    priority_class_name: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="PriorityClass of engine pods."
    )


# Kueue's names for what it reads on a pod (v0.17.0: pkg/controller/constants, pkg/controller/jobs/pod/constants,
# apis/kueue/v1beta2/topology_types.go). The API says which scheduler; render/gang.py writes these.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NODE_LABEL_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
NodeLabel = Annotated[str, Field(min_length=1, max_length=317, pattern=NODE_LABEL_KEY)]


class GangScheduler(enum.StrEnum):
    KUEUE = "Kueue"


class Gang(ApiModel):
    """Place each engine group whole or not at all, through a batch scheduler the cluster runs. Kueue admits a
    group's pods together once its queue has quota (and, with a topology-aware flavor, nodes) for all of them;
    until then none of them binds or holds a GPU. How long an admitted group that never gets Ready may keep
    what it holds is Kueue's own `waitForPodsReady`, one setting of the whole Kueue installation: Kueue v0.17
    has no per-workload timeout, so the pool has none either."""

    scheduler: GangScheduler = Field(
        default=GangScheduler.KUEUE, description="The gang scheduler: Kueue (v0.17 or later, pod integration on)."
    )
    queue_name: Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)] = Field(
        description="The Kueue LocalQueue, in the pool's namespace, the groups are queued in (a DNS label: Kueue "
                    "reads it from the pods' kueue.x-k8s.io/queue-name label)."
    )


class TopologyMode(enum.StrEnum):
    REQUIRED = "Required"
    PREFERRED = "Preferred"


class Topology(ApiModel):
    """Keep each engine group's pods inside one topology domain (a rack, an NVLink clique): the nodes that share
    one value of a node label. Carried out by Kueue's topology-aware scheduling, so it needs `gang`, and the
    queue's ResourceFlavor must name a Kueue Topology with this label as one of its levels."""

    node_label: NodeLabel = Field(
        description="The node label whose value is the domain, e.g. nvidia.com/gpu.clique or "
                    "topology.kubernetes.io/zone: a level of the Kueue Topology of the queue's flavor."
    )
    mode: TopologyMode = Field(
        default=TopologyMode.REQUIRED,
        description="Required: a group waits until one domain has room for all of its pods. Preferred: one "
                    "domain if one has room, else the next level up, else anywhere.",
    )


class Spread(ApiModel):
    """Spread the role's engine groups over the domains of a node label (failure domains: zones, racks), so that
    one domain lost takes as few of them as it can. A group counts by its first pod (node rank 0); during a
    rollout the new revision's groups spread among themselves, as a Deployment's new ReplicaSet does. Carried out
    by kube-scheduler (a topologySpreadConstraint on every pod of the role, maxSkew 1); nodes without the label,
    or with a taint the pods do not tolerate, are not domains."""

    node_label: NodeLabel = Field(
        description="The node label whose value is the domain, e.g. topology.kubernetes.io/zone or a rack label."
    )
    mode: TopologyMode = Field(
        default=TopologyMode.PREFERRED,
        description="Preferred: kube-scheduler favours the domain with the fewest of the role's groups, and places "
                    "a group anyway where that is full. Required: a group's first pod waits until it can go to a "
                    "domain that keeps the groups within one of each other (DoNotSchedule). Required cannot be "
                    "combined with scheduling.topology; with Preferred, Kueue's topology choice wins.",
    )


class Near(ApiModel):
    """Prefer nodes in the domain of a node label (a rack, an NVLink or InfiniBand island) where the other role's
    pods of the same pool run: KV transfers between a prefill and its decode engines then stay inside it. A
    preference only (kube-scheduler's preferred pod affinity): a required affinity to a role that has no pods yet,
    when a pool is created or the other role is being replaced, would leave this role's pods unschedulable for
    ever."""

    role: Role = Field(description="The other role, whose pods this role's pods are placed near: decode or prefill.")
    node_label: NodeLabel = Field(
        description="The node label whose value is the domain, e.g. a rack label or topology.kubernetes.io/zone."
    )
    weight: Annotated[int, Field(ge=1, le=100)] = Field(
        default=100, description="Weight of the preference against the user's other preferred terms (1 to 100)."
    )


_TOPOLOGY_NEEDS_GANG = Rule(
    cel="!has(self.topology) || has(self.gang)",
    holds=lambda s: s.topology is None or s.gang is not None,
    message="scheduling.topology needs scheduling.gang: Kueue's topology-aware scheduling places the group",
    field=".topology",
)
_NO_REQUIRED_SPREAD_WITH_TOPOLOGY = Rule(
    cel="!has(self.spread) || !has(self.topology) || self.spread.mode != 'Required'",
    holds=lambda s: s.spread is None or s.topology is None or s.spread.mode is not TopologyMode.REQUIRED,
    message="scheduling.spread.mode Required cannot be combined with scheduling.topology: Kueue picks a group's "
            "domain without seeing the spread, and a pod the spread then refuses would hold its quota unplaced",
    field=".spread.mode",
)


def near_names_the_other_role(role: Role) -> Rule:
    """The rule of `role`'s spec: its `scheduling.near` names the other role (a role near itself means nothing)."""
    return Rule(
        cel=f"!has(self.scheduling.near) || self.scheduling.near.role != '{role}'",
        holds=lambda r: r.scheduling.near is None or r.scheduling.near.role is not role,
        message=f"scheduling.near.role must name the other role: {role} pods cannot be placed near {role} pods",
        field=".scheduling.near.role",
    )


class EngineScheduling(Scheduling):
    """Pod placement for one role's engine pods, and how a multi-pod group is placed as one."""

    RULES = (_TOPOLOGY_NEEDS_GANG, _NO_REQUIRED_SPREAD_WITH_TOPOLOGY)

    gang: Gang | None = Field(
        default=None, description="Place each engine group whole or not at all through Kueue (off by default)."
    )
    topology: Topology | None = Field(
        default=None, description="Keep each engine group's pods in one topology domain (needs gang)."
    )
    spread: Spread | None = Field(
        default=None,
        description="Spread the role's engine groups over the domains of a node label, e.g. zones or racks (off by "
                    "default): kube-scheduler counts each group by its first pod. With gang and topology, Kueue "
                    "picks the domain and only a Preferred spread is allowed.",
    )
    near: Near | None = Field(
        default=None,
        description="Prefer placing the role's pods in a domain of a node label where the other role's pods of the "
                    "pool run (off by default). A preference only: a required affinity to a role that has no pods "
                    "yet (a new pool, the other role being replaced) would leave these pods unschedulable.",
    )
