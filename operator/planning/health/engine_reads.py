"""What a health poll reads from a pool's engines besides rank health, decided from the spec, the judged pods and
the last status: pure, so that the monitor (engines/monitor.py) only does the reads.

- `/server_info` of each group leader not asked successfully before (the serverArgs and event-loop gates), for
  groups whose pods all run their role's update revision;
- `/metrics` of the leaders a bake compares (`sampled`, while a revision other than the last completed one rolls
  out or a group still bakes) and of the leaders whose load the autoscaler or a scale-down choice reads
  (`loaded`), one GET per leader whichever reads it;
- the tool-call canary for decode leaders of groups not verified at the revision they run.

A leader at whose address another pod's agent answered in this poll (`foreign`) is asked nothing: its engine may
be another pod's too (`rank_health.own_answers`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Mapping, Set
from typing import Any

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import InferencePoolStatus
from pdfleet.operator.planning.groups import leader_pod
from pdfleet.operator.planning.health import rank_health
from pdfleet.operator.planning.rollout import bake
from pdfleet.operator.render import labels, revision

Body = dict[str, Any]
Leader = tuple[Body, int]  # a group leader's pod and its engine's HTTP port


@dataclasses.dataclass(frozen=True)
class EngineReads:
    server_info: tuple[Leader, ...] = ()
    sampled: tuple[Leader, ...] = ()
    loaded: Mapping[str, Leader] = dataclasses.field(default_factory=dict)  # group -> its leader
    # Groups whose load was asked for, answered or not: a choice waiting for it must not wait for good.
    asked: frozenset[str] = frozenset()
    canary: tuple[Body, ...] = ()  # decode leaders to send the tool-call canary

    @property
    def any(self) -> bool:
        return bool(self.server_info or self.sampled or self.loaded)

    def metrics(self) -> dict[str, Leader]:
        """The leaders whose /metrics is read, by uid: once each, whether a bake, the autoscaler or both need it."""
        return {str(pod["metadata"]["uid"]): (pod, port) for pod, port in [*self.sampled, *self.loaded.values()]}


def sampling(spec: InferencePoolSpec, last: InferencePoolStatus) -> bool:
    """Whether the pool's engines' /metrics are read in this poll: while a revision other than the one the pool
    last completed rolls out and groups of it may bake, or a group still bakes."""
    if parse_duration(spec.rollout.verification.bake).total_seconds() <= 0 or last.current_revision is None:
        return False
    return last.current_revision != revision.pool_revision(spec) or any(bake.baking(g) for g in last.groups)


def role_of(pods: list[Body]) -> Role | None:
    for pod in pods:
        value = (pod["metadata"].get("labels") or {}).get(labels.ROLE)
        with contextlib.suppress(ValueError):
            return Role(value)
    return None


def engine_reads(spec: InferencePoolSpec, judged_pods: Mapping[str, list[Body]], last: InferencePoolStatus, *,
                 known: Set[str], foreign: Set[str]) -> EngineReads:
    """The reads of one poll. `known`: uids whose /server_info is already held; `foreign`: see the module."""
    # Whose load is read: roles the autoscaler sizes, and roles with more live groups than replicas (a
    # scale-down chooses the group with the least work, or a rollout's surge group serves beside them).
    live = collections.Counter(role_of(pods) for pods in judged_pods.values() if rank_health.live_pods(pods))
    weighed = {role for role in Role
               if spec.autoscaling.role(role) is not None or live[role] > spec.role(role).replicas}
    verified = {g.name: g.verified_revision for g in last.groups if g.verified_revision is not None}
    sample = sampling(spec, last)
    infos: list[Leader] = []
    sampled: list[Leader] = []
    loaded: dict[str, Leader] = {}
    asked: set[str] = set()
    canary: list[Body] = []
    for name, pods in judged_pods.items():
        role = role_of(pods)
        if role is None or not rank_health.pollable(pods, nodes=spec.role(role).nodes_per_group):
            continue
        running = rank_health.live_pods(pods)
        head = leader_pod(running)
        ours = head is not None and head["metadata"].get("uid") not in foreign
        port = spec.role(role).port
        if sample and ours:
            sampled.append((head, port))
        if role in weighed:
            asked.add(name)
            if ours:
                loaded[name] = (head, port)
        update = revision.role_revision(spec, role)
        if not ours or {(p["metadata"].get("labels") or {}).get(labels.REVISION) for p in running} != {update}:
            continue
        if head["metadata"].get("uid") not in known:
            infos.append((head, port))
        if role is Role.DECODE and spec.rollout.verification.tool_call_canary and verified.get(name) != update:
            canary.append(head)
    return EngineReads(server_info=tuple(infos), sampled=tuple(sampled), loaded=loaded, asked=frozenset(asked),
                       canary=tuple(canary))
