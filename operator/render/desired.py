"""Everything a pool should own, as plain objects: engine groups of both roles and the router."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.render import engine_group, layout, network_policy, revision, router_objects
from pdfleet.operator.render.context import RenderContext
from pdfleet.operator.render.engine_args import Flag
from pdfleet.operator.render.engine_group import GroupId
from pdfleet.operator.render.stamp import stamped

Body = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class DesiredGroup:
    id: GroupId
    name: str
    revision: str
    pods: tuple[Body, ...]
    flags: tuple[Flag, ...] = ()  # the leader pod's operator-owned SGLang flags, as decided (the serverArgs gate's)
    surge: bool = False  # a slot above the role's kept groups, for a rollout's maxSurge (planning/scale/ordinals.py)


@dataclasses.dataclass(frozen=True)
class Desired:
    groups: tuple[DesiredGroup, ...]
    services: tuple[Body, ...]  # the engine pods' headless Services, one per role that has groups
    router: tuple[Body, ...]
    kv_layout: str
    policies: tuple[Body, ...] = ()  # NetworkPolicies, unless switched off

    def objects(self) -> list[Body]:
        out: list[Body] = [*self.policies, *self.router, *self.services]
        for group in self.groups:
            out += group.pods
        return out


Ordinals = tuple[tuple[int, ...], tuple[int, ...]]  # a role's kept groups' ordinals, and its surge slots'


def desired(ctx: RenderContext, spec: InferencePoolSpec, ordinals: Mapping[Role, Ordinals] | None = None) -> Desired:
    """Every object of the pool, each stamped with its content hash. `ordinals`: per role, the ordinals of the
    groups kept as its replicas and of the surge slots above them (planning/scale/ordinals.py); without them, groups
    0..replicas-1 and no surge slot."""
    groups = []
    revisions = {role: revision.role_revision(spec, role) for role in Role}
    for role in Role:
        base, surge = (ordinals or {}).get(role) or (tuple(range(spec.role(role).replicas)), ())
        for index in (*base, *surge):
            gid = GroupId(role, index)
            pods = engine_group.group_pods(ctx, spec, gid, revisions[role])
            groups.append(DesiredGroup(id=gid, name=gid.name(ctx.pool), revision=revisions[role],
                                       pods=tuple(stamped(p) for p in pods),
                                       flags=engine_group.pod_flags(ctx, spec, gid, 0), surge=index in surge))
    services = tuple(stamped(engine_group.headless_service(ctx, role)) for role in Role if spec.role(role).replicas)
    return Desired(groups=tuple(groups), services=services,
                   router=tuple(stamped(o) for o in router_objects.router_objects(ctx, spec)),
                   kv_layout=layout.kv_layout(spec),
                   policies=tuple(stamped(p) for p in network_policy.network_policies(ctx, spec)))
