"""Which numbered slots each role's engine groups take, and which group a scale-down removes. Pure.

A group is named `<pool>-<role>-<ordinal>`. The ordinals a role keeps (`base`, `replicas` of them) need not be
0..replicas-1: a scale-down removes the group with the least work, wherever it stands, and the rest keep their
names (a group's name is its pods' names, its status, its restart budget and its routers' worker URL, so it
never moves). What is chosen is remembered by the status the same reconcile writes (`status.groups` lists the
groups kept), and everything else is derived from what is observed, so planning again yields the same slots.

- **Kept** (`base`): the previous status's groups of the role, less its surge groups (its highest `surge`).
  Without a status (a new pool, or one whose status was lost): the groups whose pods live.
- **Scale-up**: the base grows by groups that live but were not kept (a rollout's surge group becomes a
  replica, as it did when slots were 0..replicas-1), then by the lowest ordinals no pod holds, so a new group
  never waits for a terminating one of the same name.
- **Scale-down**: the base loses, in this order, groups already going (no live pod: deleted, restarting or
  never created), groups that do not serve (a pod not Ready, not all pods there, a sick or stopped verdict),
  groups of an older revision, then the serving groups with the least work (running plus queued requests, as
  the engine's /metrics reads at the last health poll); ties go to the highest ordinal, which is also what
  happens when no load is known. When a serving group's load has not been asked yet (`Work.asked`: the health
  monitor reads it at its next poll once a role has more live groups than `replicas`), the choice waits for it.
- **Surge slots**: the ordinals right above the highest kept one, as many as `rollout.maxSurge` or as reach the
  highest group that exists above it (a scale-down's leftovers are classified there, as before); the rollout
  keeps those it needs (`surge.kept`) and the rest are deleted.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Set
from typing import Any

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import InferencePoolStatus
from pdfleet.operator.planning.groups import pod_ready
from pdfleet.operator.planning.health.rank_health import NOT_SERVING, GroupHealth
from pdfleet.operator.planning.rollout import rollout_plan
from pdfleet.operator.planning.scale.engine_load import Work
from pdfleet.operator.render import labels, revision
from pdfleet.operator.render.engine_group import GroupId

Body = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Slots:
    """One role's ordinals: the groups kept as replicas, and the surge slots above them."""

    base: tuple[int, ...]
    surge: tuple[int, ...] = ()
    waiting: str | None = None  # why a scale-down has not chosen its group yet

    @property
    def all(self) -> tuple[int, ...]:
        return self.base + self.surge


@dataclasses.dataclass(frozen=True)
class _Candidate:
    ordinal: int
    going: bool  # no live pod: deleted, being restarted, or not created
    serving: bool
    outdated: bool
    work: float | None  # running + queued requests at the last poll, None when not known


def ordinal(pool: str, role: Role, group: str) -> int | None:
    """The ordinal in a group name of `pool` and `role` (`GroupId.name`); None for any other name."""
    prefix = GroupId(role, 0).name(pool)[:-1]
    tail = group[len(prefix):] if group.startswith(prefix) else ""
    return int(tail) if tail.isdigit() and tail == str(int(tail)) else None


_POD_NAME = re.compile(r"^(?P<group>.+)-(?P<rank>\d+)$")


def slots(pool: str, spec: InferencePoolSpec, pods: Mapping[str, list[Body]], previous: InferencePoolStatus, *,
          deleting: Set[str] = frozenset(), created: Iterable[str] = (),
          health: Mapping[str, GroupHealth] | None = None, work: Work | None = None) -> dict[Role, Slots]:
    """Each role's slots. `pods`: the pool's pods by group; `deleting`: names of pods this operator is deleting
    and `created`: names of pods it created, that the watch may not show yet; `health`: the last verdicts;
    `work`: what the last health poll read of the groups' load (None: not known, and not waited for)."""
    health = health or {}
    just_created = {m.group("group") for name in created if (m := _POD_NAME.match(name))}
    out: dict[Role, Slots] = {}
    for role in Role:
        replicas = spec.role(role).replicas
        present: set[int] = set()
        live: set[int] = set()
        for name in {*pods, *just_created}:
            if (n := ordinal(pool, role, name)) is None:
                continue
            present.add(n)
            group_pods = pods.get(name, [])
            if name in just_created or any(not p["metadata"].get("deletionTimestamp") and
                                           p["metadata"]["name"] not in deleting for p in group_pods):
                live.add(n)
        base = _kept(pool, role, previous, live)
        waiting = None
        if len(base) < replicas:
            base = base + _fill(replicas - len(base), base, live, present)
        elif len(base) > replicas:
            candidates = [_candidate(pool, spec, role, n, pods, live, health, work) for n in base]
            victims, waiting = _victims(candidates, len(base) - replicas, asked=None if work is None else work.asked,
                                        pool=pool, role=role)
            if waiting is None:
                base = tuple(n for n in base if n not in victims)
        top = max(base, default=-1)
        above = [n for n in present if n > top]
        count = max(rollout_plan.max_surge(spec.rollout, role), max(above, default=top) - top)
        out[role] = Slots(base=tuple(sorted(base)), surge=tuple(range(top + 1, top + 1 + count)), waiting=waiting)
    return out


def _kept(pool: str, role: Role, previous: InferencePoolStatus, live: Set[int]) -> tuple[int, ...]:
    listed = sorted(n for g in previous.groups if g.role is role and (n := ordinal(pool, role, g.name)) is not None)
    if not listed:
        return tuple(sorted(live))
    surge = min(previous.role(role).surge or 0, len(listed))
    return tuple(listed[:len(listed) - surge])


def _fill(count: int, base: tuple[int, ...], live: Set[int], present: Set[int]) -> tuple[int, ...]:
    adopted = sorted(live - set(base))[:count]
    taken = {*base, *present}
    fresh: list[int] = []
    n = 0
    while len(adopted) + len(fresh) < count:
        if n not in taken:
            fresh.append(n)
        n += 1
    return tuple(adopted + fresh)


def _candidate(pool: str, spec: InferencePoolSpec, role: Role, n: int, pods: Mapping[str, list[Body]],
               live: Set[int], health: Mapping[str, GroupHealth], work: Work | None) -> _Candidate:
    name = GroupId(role, n).name(pool)
    mine = [p for p in pods.get(name, []) if not p["metadata"].get("deletionTimestamp")]
    verdict = health.get(name)
    serving = (n in live and len(mine) >= spec.role(role).nodes_per_group and all(pod_ready(p) for p in mine)
               and (verdict is None or verdict.verdict not in NOT_SERVING))
    revisions = {(p["metadata"].get("labels") or {}).get(labels.REVISION) for p in mine}
    load = work.loads.get(name) if work is not None else None
    return _Candidate(ordinal=n, going=n not in live, serving=serving,
                      outdated=bool(mine) and revisions != {revision.role_revision(spec, role)},
                      work=None if load is None else load.running + load.queue)


def _victims(candidates: list[_Candidate], count: int, *, asked: Set[str] | None, pool: str,
             role: Role) -> tuple[set[int], str | None]:
    """The `count` groups a scale-down removes, or why it waits for their load."""
    def rank(c: _Candidate) -> tuple[int, float, int]:
        kind = 0 if c.going else 1 if not c.serving else 2 if c.outdated else 3
        return kind, math.inf if c.work is None else c.work, -c.ordinal

    ranked = sorted(candidates, key=rank)
    chosen = ranked[:count]
    if asked is not None and any(rank(c)[0] == 3 for c in chosen):
        # A serving group is to go: which one is decided by load, so every serving group's must have been asked.
        unasked = [c for c in candidates if rank(c)[0] == 3 and GroupId(role, c.ordinal).name(pool) not in asked]
        if unasked:
            return set(), (f"scaling {role} down: waiting for the next health poll to read the load of "
                           f"{len(unasked)} serving group(s), to remove the one with the least work")
    return {c.ordinal for c in chosen}, None
