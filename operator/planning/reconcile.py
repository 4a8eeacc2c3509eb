"""The planner: (pool, what the cluster has, what we just wrote, now) -> Plan. Pure: no I/O, no clock.

Level-based and idempotent: it derives everything from its inputs every time, so create, update, resume and a
periodic resync all run the same code, and planning again right after applying a plan yields an empty plan.

Engine groups live and die as units. A group rendered from an older spec is replaced whole, at most
`rollout.maxUnavailable` groups of a role at a time (or, with `rollout.maxSurge`, only once a surge group above
`replicas` serves in its place: `surge`), one role after the other in `rollout.order`: the second role
keeps its old groups until every group of the first runs the new revision, is Ready and is verified (so a
revision that fails to start stops at the first role). A replaced group counts against `maxUnavailable` until it
passed `rollout.verification`'s gates (`verification`, whose inputs are `health` and `engines`, what the monitor
saw of each group's engines); a failed gate holds every further replacement until the spec changes. A
scale-down removes the groups with the least work (`ordinals`: which numbered slots each role keeps). A group
is restarted whole (deleted and recreated) for one of the causes `restarts` decides on, with backoff and within a
budget: a pod of it ended, or its ranks are in Desync, Hang or Dead.

Rank health is an input like the observed objects: `health` maps a group name to what the operator last
judged of its ranks (`rank_health.GroupHealth`, from polling the agents). A group counts as ready only when
its pods are Ready and its verdict is Healthy or Unknown (Unknown: no agent of its pods has answered yet, or
its ranks are not in their event loop; pod readiness is then the best signal there is). Desync, Hang, Dead
and Unreachable groups are not ready and make the pool Degraded; a Stopped group (its ranks exited cleanly:
shut down on purpose) is not ready either, but is not sick: never Degraded, captured or restarted for it.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Set
from typing import Any

from pdfleet.operator.api import checks, pool_policy
from pdfleet.operator.api.conditions import Condition, ConditionStatus, ConditionType
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import (
    GateState,
    GroupStatus,
    InferencePoolStatus,
    Phase,
    RoleStatus,
    RouterStatus,
    Verdict,
)
from pdfleet.operator.cache import Observed
from pdfleet.operator.planning import patch_set, status_writes
from pdfleet.operator.planning.groups import (
    Expectations,
    GroupState,
    classify,
    ended_exit,
    leader_pod,
    pod_ended,
    pod_ready,
    pods_by_group,
)
from pdfleet.operator.planning.health import health_status, playbooks, rank_health, restarts
from pdfleet.operator.planning.health.rank_health import NOT_SERVING, GroupHealth, settled_message
from pdfleet.operator.planning.plan import Analysis, Event, ObjectRef, Plan, Restart
from pdfleet.operator.planning.renders import Renders
from pdfleet.operator.planning.rollout import bake, rollback, rollout_plan, toolcall_integrity, verification, watch
from pdfleet.operator.planning.rollout import surge as surge_plan
from pdfleet.operator.planning.rollout.verification import EngineFacts, Outcome
from pdfleet.operator.planning.router.router_breakers import RouterView
from pdfleet.operator.planning.scale import gang_wait, ordinals
from pdfleet.operator.planning.scale.engine_load import Work
from pdfleet.operator.planning.spec_change import SpecChange
from pdfleet.operator.render import labels, revision
from pdfleet.operator.render.context import RenderContext, Settings
from pdfleet.operator.render.desired import Desired, DesiredGroup
from pdfleet.operator.render.stamp import applied_hash

Body = dict[str, Any]
# Seconds a group's pods get to stop when it is restarted. Its preStop drain would wait the whole grace period
# (180 s) for requests that a desynced, hung or half-ended engine can never finish; its evidence is already
# taken and the routers have already dropped it.
SICK_GRACE_SECONDS = 5
# Seconds a group of a revision that failed its gates or bake gets to stop when it is replaced (rolled back): its
# in-flight requests may finish, but a broken engine's drain would otherwise wait out the whole grace period.
FAILED_GRACE_SECONDS = 15


@dataclasses.dataclass
class _Builder:
    apply: list[Body] = dataclasses.field(default_factory=list)
    delete: list[ObjectRef] = dataclasses.field(default_factory=list)
    events: list[Event] = dataclasses.field(default_factory=list)
    capture: list[restarts.EvidenceRequest] = dataclasses.field(default_factory=list)
    restarted: list[Restart] = dataclasses.field(default_factory=list)
    pool_changes: list[SpecChange] = dataclasses.field(default_factory=list)
    analyses: list[Analysis] = dataclasses.field(default_factory=list)

    def delete_objects(self, objects: list[Body], *, grace_period_seconds: int | None = None) -> None:
        for obj in objects:
            ref = ObjectRef(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], obj["metadata"].get("uid"),
                            grace_period_seconds)
            if not obj["metadata"].get("deletionTimestamp") and ref not in self.delete:
                self.delete.append(ref)


def _keys(objects: list[Body]) -> tuple[tuple[str, str], ...]:
    return tuple((o["kind"], o["metadata"]["name"]) for o in objects)


def plan(pool: Body, observed: Observed, *, now: datetime.datetime, expect: Expectations | None = None,
         settings: Settings | None = None, health: Mapping[str, GroupHealth] | None = None,
         engines: Mapping[str, EngineFacts] | None = None, router_key: str = "key-1",
         renders: Renders | None = None, work: Work | None = None,
         gang_reasons: Mapping[str, str] | None = None,
         routers: Mapping[str, RouterView] | None = None) -> Plan:
    """What to do for `pool`, from what was observed: pure, with the time (`now`, aware) from the caller.
    `renders`: what earlier plans derived from the same spec and status (the executor keeps one); the plan is the
    same with or without it. `work`: the groups' load at the last health poll, which a scale-down's choice of
    group waits for (`ordinals`); None: not known, and not waited for. `gang_reasons`: why Kueue refuses the
    gangs it holds, by Kueue group name (`gang_wait`). `routers`: what each router pod could route to at the last
    health poll (`router_breakers`)."""
    renders = renders if renders is not None else Renders()
    expect = expect or Expectations()
    pods = pods_by_group(observed.of_kind("Pod"))
    health = rank_health.current(health or {}, pods)
    now = now.replace(microsecond=0)
    generation = pool["metadata"].get("generation")
    previous = renders.previous(pool)
    spec, problems = renders.validated(pool)
    if spec is None or problems:
        return _rejected_plan(pool, previous, problems, generation, now)
    if refused := pool_policy.problems(spec, (settings or Settings()).policy):
        return _rejected_plan(pool, previous, refused, generation, now, reason=REFUSED_BY_POLICY)
    ctx = RenderContext.of(pool, settings, router_key=router_key)
    if spec.paused:
        return _status_only(pool, previous, _paused_status(previous, generation, now))

    numbered = ordinals.slots(ctx.pool, spec, pods, previous, deleting={n for k, n in expect.deleting if k == "Pod"},
                              created=[n for k, n in expect.applied if k == "Pod"], health=health, work=work)
    slots = renders.desired(pool, ctx, spec, {role: (s.base, s.surge) for role, s in numbered.items()})
    out = _Builder()
    _plan_shared_objects(slots, observed, expect, out)
    states = {g.name: classify(g, pods.get(g.name, []), expect) for g in slots.groups}
    outcomes = _verify(pool, spec, slots, states, pods, previous, health, engines or {}, now)
    unschedulable, said = surge_plan.unschedulable(spec, slots, pods, previous, revision.pool_revision(spec),
                                                   gang_reasons)
    out.events.extend(said)
    counts = rollout_plan.surge(spec.rollout, _rollout_groups(spec, slots, states, outcomes),
                                stopped=any(o.stopped for o in outcomes.values()), unschedulable=unschedulable)
    want = surge_plan.kept(spec, slots, counts)
    kept = {g.name for g in want.groups}
    states = {n: s for n, s in states.items() if n in kept}
    outcomes = {n: o for n, o in outcomes.items() if n in kept}
    _plan_groups(spec, want, observed, states, outcomes, expect, out, unschedulable)
    _plan_removals(want, observed, expect, out, surge_plan.removed(spec, slots, kept, previous),
                   failed={g.name for g in previous.groups if verification.failed(g.verification)})
    new_status = _status(pool, spec, want, states, observed, previous, generation, now, out, health, ctx, expect,
                         outcomes, unschedulable, gang_reasons or {}, routers or {})
    if (patches := renders.patches(pool)) is not None:
        new_status = new_status.model_copy(update={"patches": patches.status})
        out.events.extend(patch_set.events(pool["metadata"].get("name", ""), patches.status, previous.patches))
    if (verified := rollback.record(pool, new_status, now)) is not None:
        out.pool_changes.append(verified)
    if (playbook := playbooks.decide(pool, spec, new_status.groups, out.restarted, observed.of_kind("ConfigMap"),
                                     now, spec_changing=any(c.changes_spec for c in out.pool_changes))) is not None:
        out.pool_changes.append(playbook.change)
        out.events.append(playbook.event)
    waits = [g.next_restart_time for g in new_status.groups if g.next_restart_time is not None] + \
        [o.deadline for o in outcomes.values() if o.deadline is not None] + \
        [w.until for w in (new_status.watch,) if w is not None and w.until is not None and w.failure is None
         and w.until > now] + \
        [now + parse_duration(spec.health.heartbeat_period) for s in numbered.values() if s.waiting is not None]
    return Plan(apply=tuple(out.apply), delete=tuple(out.delete),
                status=_changed_status(new_status, previous, pool.get("status")),
                events=tuple(out.events), capture=tuple(out.capture), restarted=tuple(out.restarted),
                requeue_after=max(0.0, (min(waits) - now).total_seconds()) if waits else None,
                pool_changes=tuple(out.pool_changes), analyses=tuple(out.analyses))


def _changed_status(new: InferencePoolStatus, previous: InferencePoolStatus,
                    raw_previous: Mapping[str, Any] | None) -> Body | None:
    """The new status in wire form if it differs from the pool's (`status.changed`), else None. A status equal to
    the one parsed from the pool dumps to the same wire form, so the common case, nothing changed, dumps nothing."""
    if raw_previous is not None and new == previous:
        return None
    wired = status_writes.wire(new)
    return wired if raw_previous is None or wired != status_writes.wire(previous) else None


def _needs_write(obj: Body, observed: Mapping[tuple[str, str], Body], expect: Expectations) -> bool:
    key = (obj["kind"], obj["metadata"]["name"])
    want = applied_hash(obj)
    current = observed.get(key)
    if current is not None and applied_hash(current) == want:
        return False
    return expect.applied.get(key) != want


def _plan_shared_objects(want: Desired, observed: Observed, expect: Expectations, out: _Builder) -> None:
    """NetworkPolicies, router objects and the engines' Services: mutable, so a changed one is simply applied
    again."""
    for obj in [*want.policies, *want.router, *want.services]:
        if _needs_write(obj, observed.owned, expect):
            out.apply.append(obj)


def _other_layout(pods: list[Body], layout: str) -> list[Body]:
    """Engine pods whose KV layout differs from `layout` (pods from before layouts were labelled count as
    matching: nothing says otherwise)."""
    return [p for p in pods if (p["metadata"].get("labels") or {}).get(labels.KV_LAYOUT, layout) != layout]


def _plan_layout_change(want: Desired, observed: Observed, out: _Builder) -> bool:
    """A new KV layout replaces every group at once. Prefill writes the KV pages decode reads: an old-layout
    and a new-layout engine behind one router would exchange caches neither can read. So all old-layout pods
    go first (both roles), and no new one starts while any old one is still there. True while that holds."""
    old = _other_layout(observed.of_kind("Pod"), want.kv_layout)
    if not old:
        return False
    live = [p for p in old if not p["metadata"].get("deletionTimestamp")]
    if live:
        groups = sorted({(p["metadata"].get("labels") or {}).get(labels.GROUP, "?") for p in live})
        out.delete_objects(live)
        out.events.append(Event("Normal", "LayoutChanged",
                                f"the KV layout changes to {want.kv_layout}: replacing every engine group at once "
                                f"({', '.join(groups)}); old and new layouts must never serve one router",
                                about=_keys(live)))
    return True


def _verify(pool: Body, spec: InferencePoolSpec, want: Desired, states: Mapping[str, GroupState],
            pods: Mapping[str, list[Body]], previous: InferencePoolStatus, health: Mapping[str, GroupHealth],
            engines: Mapping[str, EngineFacts], now: datetime.datetime) -> dict[str, Outcome]:
    before = {g.name: g for g in previous.groups}
    baking = bake.policy(spec.rollout.verification.bake, current_revision=previous.current_revision,
                         update_revision=revision.pool_revision(spec),
                         verified_before=[e.revision for e in rollback.history(pool)])
    samples = {uid: s for facts in engines.values() for uid, s in facts.metrics.items()}
    # The baseline of a role: the leaders of its groups still serving the old revision.
    baseline: dict[Role, list[str]] = {}
    for g in want.groups:
        head = leader_pod(rank_health.live_pods(pods.get(g.name, [])))
        if states[g.name] is GroupState.OUTDATED and head is not None and head["metadata"].get("uid"):
            baseline.setdefault(g.id.role, []).append(str(head["metadata"]["uid"]))
    return {g.name: verification.verify(
        spec.rollout.verification, role=g.id.role, expected_loop=verification.expected_event_loop(spec, g.id.role),
        revision=g.revision, ready=states[g.name] is GroupState.READY, want_flags=g.flags,
        patches=spec.engine.patches,
        pods=pods.get(g.name, []), before=before.get(g.name), health=health.get(g.name),
        facts=engines.get(g.name), now=now, baking=baking, samples=samples,
        baseline=baseline.get(g.id.role, []), state=states[g.name]) for g in want.groups}


def _rollout_groups(spec: InferencePoolSpec, want: Desired, states: Mapping[str, GroupState],
                    outcomes: Mapping[str, Outcome]) -> list[rollout_plan.Group]:
    return [rollout_plan.Group(g.name, g.id.role, states[g.name], outcomes[g.name].verified,
                               surge=g.surge) for g in want.groups]


def _plan_groups(spec: InferencePoolSpec, want: Desired, observed: Observed, states: Mapping[str, GroupState],
                 outcomes: Mapping[str, Outcome], expect: Expectations, out: _Builder,
                 unschedulable: Set[Role]) -> None:
    """Replaces the outdated groups the rollout's step picks (`rollout_plan.step`: roles in order, the canary first,
    then as maxSurge or maxUnavailable allow, nothing once stopped) and creates missing ones (surge groups too)."""
    pods = pods_by_group(observed.of_kind("Pod"))
    if _plan_layout_change(want, observed, out):
        return
    picked = rollout_plan.step(spec.rollout, _rollout_groups(spec, want, states, outcomes),
                               stopped=any(o.stopped for o in outcomes.values()), unschedulable=unschedulable).replace
    for role in rollout_plan.order(spec.rollout):
        groups = [g for g in want.groups if g.id.role is role]
        # One Event per role and step, naming its groups: a new pool of 8 groups says so in 2 Events, not 8.
        replaced: list[tuple[DesiredGroup, list[Body]]] = []
        created: list[tuple[DesiredGroup, list[Body]]] = []
        for group in groups:
            state = states[group.name]
            current = pods.get(group.name, [])
            if state is GroupState.FAILED:
                continue  # restarted, or left, by `_act_on_health`: every restart has one home
            if group.name in picked:
                # A group whose revision failed its gates or bake here (the canary of a revision being rolled
                # back) drains briefly: a broken engine's queue may never empty, and its slot is what the
                # rollback waits for.
                failed = verification.failed(outcomes[group.name].verification)
                out.delete_objects(current, grace_period_seconds=FAILED_GRACE_SECONDS if failed else None)
                replaced.append((group, current))
            elif state in (GroupState.MISSING, GroupState.PARTIAL):
                missing = _create_missing_pods(group, current, expect, out)
                if state is GroupState.MISSING and missing:
                    created.append((group, missing))
        if replaced:
            out.events.append(Event("Normal", "GroupReplaced",
                                    f"replacing {role} {_names(g for g, _ in replaced)} with revision "
                                    f"{replaced[0][0].revision}", about=_keys([p for _, ps in replaced for p in ps])))
        if created:
            pods_ = [p for g, _ in created for p in g.pods]
            gpus = sum(int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) for p in pods_)
            extra = any(g.surge for g, _ in created)
            out.events.append(Event("Normal", "GroupCreated",
                                    f"created {role} {_names(g for g, _ in created)} at revision "
                                    f"{created[0][0].revision}: {len(pods_)} pod(s), {gpus} GPU(s)" +
                                    (" above replicas (maxSurge): it serves before an old group goes"
                                     if extra else ""),
                                    about=_keys([p for _, ps in created for p in ps])))


def _names(groups: Iterable[DesiredGroup]) -> str:
    """'group a' or 'groups a, b': the Event messages' way of naming the groups one step touched."""
    names = [g.name for g in groups]
    return f"group{'s' if len(names) > 1 else ''} {', '.join(names)}"


def _create_missing_pods(group: DesiredGroup, current: list[Body], expect: Expectations,
                         out: _Builder) -> list[Body]:
    have = {p["metadata"]["name"] for p in current}
    missing = [p for p in group.pods if p["metadata"]["name"] not in have
               and expect.applied.get(("Pod", p["metadata"]["name"])) != applied_hash(p)]
    out.apply.extend(missing)
    return missing


def _plan_removals(want: Desired, observed: Observed, expect: Expectations, out: _Builder,
                   surge_done: Set[str] = frozenset(), failed: Set[str] = frozenset()) -> None:
    """Objects the pool owns that the spec no longer asks for: groups past `replicas` (`surge_done`: those that
    were a rollout's surge groups; `failed`: groups whose revision failed its gates or bake, which drain only
    briefly, as a rolled-back canary does), a router scaled to 0."""
    wanted = {(o["kind"], o["metadata"]["name"]) for o in want.objects()}
    stale_groups: dict[str, list[Body]] = {}
    for key, obj in sorted(observed.owned.items()):
        if key in wanted or key in expect.deleting or restarts.is_evidence(obj):
            continue  # evidence is kept (pruned by `restarts.stale_evidence` only)
        group = (obj["metadata"].get("labels") or {}).get(labels.GROUP)
        if group:
            stale_groups.setdefault(group, []).append(obj)
        else:
            out.delete_objects([obj])
    for group, objects in sorted(stale_groups.items()):
        if any(o["kind"] == "Pod" and not o["metadata"].get("deletionTimestamp") for o in objects):
            why = "a rollout's surge group, no longer needed" if group in surge_done else "scaled down"
            out.events.append(Event("Normal", "GroupDeleted", f"deleted group {group}: {why}", about=_keys(objects)))
        out.delete_objects(objects, grace_period_seconds=FAILED_GRACE_SECONDS if group in failed else None)


# Group states whose pods all run, so that their ranks can be judged (an outdated group still serves).
_JUDGED = {GroupState.READY, GroupState.OUTDATED}


def _group_status(group: DesiredGroup, state: GroupState, pods: list[Body], previous: InferencePoolStatus,
                  judged: GroupHealth | None, gang_reasons: Mapping[str, str]) -> GroupStatus:
    before = next((g for g in previous.groups if g.name == group.name), None)
    revisions = {(p["metadata"].get("labels") or {}).get(labels.REVISION) for p in pods} - {None}
    ready_pods = sum(pod_ready(p) for p in pods if not p["metadata"].get("deletionTimestamp"))
    pods_message = f"{state}: {ready_pods}/{len(group.pods)} pod(s) ready"
    if state not in _JUDGED:  # starting, restarting or going: whatever was judged of its ranks is over
        verdict, event_loop, ranks, message = Verdict.UNKNOWN, None, 0, pods_message
        if (waiting := gang_wait.message(pods, len(group.pods), gang_reasons)) is not None:
            message = f"{pods_message}; {waiting}"
        if before is not None and before.restart_cause is not None and before.next_restart_time is None and \
                state in (GroupState.TERMINATING, GroupState.MISSING):
            # Its ranks are no longer judged, but why it is going is what a person looking now needs to read.
            message = f"restarting after {before.restart_cause} (restart {before.restarts}): {pods_message}"
    elif judged is None:  # not polled yet (the operator just started): the last status is the best news
        verdict = before.verdict if before else Verdict.UNKNOWN
        event_loop = before.event_loop if before else None
        ranks = before.ranks if before else 0
        message = before.message if before and before.message else pods_message
    else:
        last = GroupHealth(before.verdict, before.event_loop, before.message or "", before.ranks) if before else None
        verdict, event_loop, ranks = judged.verdict, judged.event_loop, judged.ranks
        message = settled_message(last, judged)
    return GroupStatus(
        name=group.name,
        role=group.id.role,
        revision=revisions.pop() if len(revisions) == 1 else group.revision,
        ranks=ranks,
        verdict=verdict,
        event_loop=event_loop,
        restarts=before.restarts if before else 0,
        last_restart_time=before.last_restart_time if before else None,
        recent_restarts=before.recent_restarts if before else (),
        restart_cause=before.restart_cause if before else None,
        budget_exhausted=before.budget_exhausted if before else False,
        last_exit=before.last_exit if before else None,
        message=message,
    )


def _act_on_health(spec: InferencePoolSpec, group: DesiredGroup, state: GroupState, pods: list[Body],
                   observed: Observed, expect: Expectations, now: datetime.datetime, out: _Builder,
                   ctx: RenderContext, status: GroupStatus) -> GroupStatus:
    """A restart as a unit, whatever its cause (`restarts.decide`): a pod of the group ended, or its ranks are
    in Desync, Hang or Dead (evidence first). The status of the group after it."""
    want = {p["metadata"]["name"]: applied_hash(p) for p in group.pods}
    ended = ended_exit(pods) if state is GroupState.FAILED else None
    decision = restarts.decide(
        spec.health, ctx, status, ended=ended, judged=state in _JUDGED,
        gone=state in (GroupState.MISSING, GroupState.PARTIAL, GroupState.TERMINATING),
        outdated=any(pod_ended(p) and applied_hash(p) != want.get(p["metadata"]["name"]) for p in pods),
        pods=pods, configmaps=observed.of_kind("ConfigMap"), pending=expect.applied, now=now)
    if decision.request is not None:
        out.capture.append(decision.request)
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    ended_why = restarts.exit_summary(ended) if ended is not None else ""
    if decision.action is restarts.Action.REPLACE:
        out.delete_objects(live, grace_period_seconds=SICK_GRACE_SECONDS)
        out.events.append(Event("Normal", "GroupReplaced",
                                f"replacing {group.id.role} group {group.name} with revision {group.revision}: "
                                f"{ended_why}; its restart budget starts afresh", about=_keys(live)))
        return decision.status
    if decision.action is not restarts.Action.RESTART or decision.cause is None:
        return decision.status
    recent = len(restarts.in_window(spec.health, status, now)) + 1
    if ended is not None:
        why = ended_why
    else:
        where = f"evidence in ConfigMap {decision.evidence}" if decision.evidence else "evidence capture disabled"
        why = f"{status.verdict} ({status.message}); {where}"
    message = (f"restarting {group.id.role} group {group.name} as a unit: {why}; restart {recent} of "
               f"{spec.health.restart_budget.count} in {spec.health.restart_budget.window}")
    # A sick or half-ended engine never finishes what it has in flight: no drain, just the time to stop.
    out.delete_objects(live, grace_period_seconds=SICK_GRACE_SECONDS)
    out.restarted.append(Restart(group.name, str(decision.cause), _keys(live)))
    out.events.append(Event("Warning", "GroupRestarted", message, about=_keys(live)))
    return restarts.restarted(spec.health, decision.status, now, decision.cause)


def _serving(state: GroupState, group: GroupStatus) -> bool:
    return state is GroupState.READY and group.verdict not in NOT_SERVING


def _status(pool: Body, spec: InferencePoolSpec, want: Desired, states: Mapping[str, GroupState], observed: Observed,
            previous: InferencePoolStatus, generation: int | None, now: datetime.datetime,
            out: _Builder, health: Mapping[str, GroupHealth], ctx: RenderContext,
            expect: Expectations, outcomes: Mapping[str, Outcome], unschedulable: Set[Role],
            gang_reasons: Mapping[str, str], routers: Mapping[str, RouterView]) -> InferencePoolStatus:
    pods = pods_by_group(observed.of_kind("Pod"))
    groups = tuple(_act_on_health(spec, g, states[g.name], pods.get(g.name, []), observed, expect, now, out, ctx,
                                  _group_status(g, states[g.name], pods.get(g.name, []), previous,
                                                health.get(g.name), gang_reasons))
                   .model_copy(update={"verified_revision": outcomes[g.name].verified_revision,
                                       "verification": outcomes[g.name].verification})
                   for g in want.groups)
    out.events.extend(gang_wait.events(groups, previous))
    configmaps = observed.of_kind("ConfigMap")
    out.delete_objects([cm for cm in restarts.stale_evidence(spec.health, configmaps, [g.name for g in groups])
                        if ("ConfigMap", cm["metadata"]["name"]) not in expect.deleting])
    by_name = {g.name: g for g in groups}
    counts = {}
    for role in Role:
        mine = [g for g in want.groups if g.id.role is role]
        counts[role] = RoleStatus.of(
            desired=spec.role(role).replicas,
            ready=sum(_serving(states[g.name], by_name[g.name]) for g in mine),
            updated=sum(outcomes[g.name].verified for g in mine if not g.surge),
            surge=sum(g.surge for g in mine),
            surge_unschedulable=revision.pool_revision(spec) if role in unschedulable else None,
        )
    router_views = _router_views(observed, routers, previous)
    router_ok = _router_available(spec, observed, router_views)
    all_ready = all(c.ready >= c.desired for c in counts.values()) and router_ok
    # A rollout, rollback or restart is over only once every router lists the groups in rotation again.
    judged = rollout_plan.judge(pool, spec, want.groups, states, outcomes, previous, by_name, now,
                                router_ok=router_ok and all(v.settled for v in router_views))
    update_rev, rollout, settled, watched = judged.update, judged.condition, judged.settled, judged.watched
    _say_bakes(want, outcomes, out, now)
    if judged.decision.change is not None:
        out.pool_changes.append(judged.decision.change)
    if judged.decision.event is not None:
        out.events.append(judged.decision.event)
    failed = [n for n, s in states.items() if s is GroupState.FAILED]
    degraded = health_status.degraded(groups, failed)
    summary = (f"prefill {counts[Role.PREFILL].summary} ready, decode {counts[Role.DECODE].summary} ready"
               + ("" if router_ok else ", router not available") + _routers_lacking(router_views))
    prev_conds = previous.conditions
    progressing_reason = "RollingOut" if any(s is GroupState.OUTDATED for s in states.values()) else \
        "Verifying" if rollout.status is ConditionStatus.UNKNOWN and not any(
            s in rollout_plan.UNAVAILABLE for s in states.values()) else "Reconciling"
    stopped = rollout.status is ConditionStatus.FALSE
    watching = rollout.reason == watch.WATCHING_REASON
    paused = spec.rollout.paused and not settled and not stopped
    integrity = toolcall_integrity.judge(spec)
    conds = [
        _accepted(prev_conds, generation, now),
        status_writes.condition(prev_conds, ConditionType.READY, all_ready, "AllGroupsReady" if all_ready else
                             "GroupsNotReady", summary, generation=generation, now=now),
        status_writes.condition(prev_conds, ConditionType.PROGRESSING,
                             ConditionStatus.UNKNOWN if paused else (not settled or watching) and not stopped,
                             rollout.reason if stopped or watching else "Stable" if settled else "Paused" if paused
                             else progressing_reason, rollout.message if stopped or watching else
                             _paused_message(states, summary) if paused else summary, generation=generation,
                             now=now),
        status_writes.condition(prev_conds, ConditionType.DEGRADED, degraded.status, degraded.reason,
                             degraded.message, generation=generation, now=now),
        status_writes.condition(prev_conds, ConditionType.ROLLOUT_VERIFIED, rollout.status, rollout.reason,
                             rollout.message, generation=generation, now=now),
        status_writes.condition(prev_conds, ConditionType.TOOL_CALL_INTEGRITY, integrity.status, integrity.reason,
                             integrity.message, generation=generation, now=now),
    ]
    if integrity.status is ConditionStatus.FALSE and not status_writes.holds(
            prev_conds, ConditionType.TOOL_CALL_INTEGRITY, integrity.status, integrity.reason, integrity.message):
        out.events.append(Event("Warning", "ToolCallLeakRisk", integrity.message))
    phase = Phase.FAILED if stopped else Phase.READY if all_ready else Phase.DEGRADED if degraded.status else \
        Phase.PROGRESSING if any(s is not GroupState.MISSING for s in states.values()) else Phase.PENDING
    if stopped and not status_writes.holds(prev_conds, ConditionType.ROLLOUT_VERIFIED, rollout.status, rollout.reason,
                                        rollout.message):
        # Once per failure: the condition stays False with this message until the spec changes.
        reason = {verification.ANALYSIS_FAILED: "RolloutAnalysisFailed",
                  watch.FAILED_REASON: "RolloutRevisionFailed"}.get(rollout.reason, "RolloutGateFailed")
        out.events.append(Event("Warning", reason, f"rollout stopped: {rollout.message}"))
    was_ready = any(c.type == ConditionType.READY and c.status == "True" for c in prev_conds)
    out.events.extend(health_status.transition_events(previous, groups))
    out.events.extend(health_status.exhausted_events(previous, groups))
    out.events.extend(health_status.backoff_events(previous, groups))
    if all_ready and not was_ready:
        out.events.append(Event("Normal", "PoolReady", f"pool is Ready: {summary}"))
    if settled and previous.current_revision is not None and previous.current_revision != update_rev:
        if watching:
            out.events.append(Event("Normal", "RolloutWatching",
                                    f"rollout from revision {previous.current_revision} to {update_rev}: all "
                                    f"{len(groups)} group(s) replaced and verified; {rollout.message}"))
        elif not stopped:
            out.events.append(Event("Normal", "RolloutCompleted",
                                    f"rollout from revision {previous.current_revision} to {update_rev} completed: "
                                    f"all {len(groups)} group(s) replaced and verified"))
    if watched.passed and any(c.type == ConditionType.ROLLOUT_VERIFIED and c.reason == watch.WATCHING_REASON
                              for c in prev_conds):
        out.events.append(Event("Normal", "RolloutCompleted",
                                f"rollout to revision {update_rev} completed: every group verified, and "
                                f"postRolloutWatch {spec.rollout.post_rollout_watch} passed"))
    for role in Role:
        before = (previous.prefill if role is Role.PREFILL else previous.decode).desired
        if previous.observed_generation is not None and before != counts[role].desired:
            out.events.append(Event("Normal", "Scaled",
                                    f"scaled {role} from {before} to {counts[role].desired} group(s)"))
    return InferencePoolStatus(
        phase=phase,
        observed_generation=generation,
        current_revision=update_rev if settled else previous.current_revision,
        update_revision=update_rev,
        prefill=counts[Role.PREFILL],
        decode=counts[Role.DECODE],
        groups=groups,
        watch=watched.watch,
        routers=tuple(RouterStatus(name=v.router, available_prefill=v.available.get(str(Role.PREFILL), 0),
                                   available_decode=v.available.get(str(Role.DECODE), 0),
                                   open_circuits=len(v.open_circuits), missing_workers=len(v.missing))
                     for v in router_views),
        autoscaling=previous.autoscaling,  # the autoscaler's to write (operator/autoscaler.py): carried as it is
        conditions=status_writes.merge_conditions(prev_conds, conds),
    )


def _say_bakes(want: Desired, outcomes: Mapping[str, Outcome], out: _Builder, now: datetime.datetime) -> None:
    """An Event when a group begins to bake (RolloutCanaryBaking for the first of its role) and when its bake
    passed; a failed bake is said by the rollout's stop (RolloutAnalysisFailed). Every bake judged is counted."""
    for g in want.groups:
        outcome = outcomes[g.name]
        check = outcome.verification
        record = check.bake if check is not None else None
        if check is None or record is None:
            continue
        if outcome.baking_started:
            canary = not any(outcomes[o.name].verified for o in want.groups if o.id.role is g.id.role)
            compared = len(record.start) - 1
            against = f"compared with {compared} group(s) of the old revision" if compared else \
                "no group of the old revision serves to compare with: judged on its own"
            out.events.append(Event(
                "Normal", "RolloutCanaryBaking" if canary else "RolloutGroupBaking",
                f"{'canary ' if canary else ''}{g.id.role} group {g.name} of revision {g.revision} passed its gates "
                f"and bakes until {record.until:%H:%M:%SZ}: {against}"))
        elif outcome.bake_result is not None:
            result = {GateState.PASSED: "passed", GateState.FAILED: "failed"}.get(outcome.bake_result, "timed_out")
            out.analyses.append(Analysis(g.name, result, max(0.0, (now - record.since).total_seconds())))
            gate = next(x for x in check.gates if x.name == bake.BAKE)
            if outcome.bake_result is GateState.PASSED:
                out.events.append(Event("Normal", "RolloutBakePassed", f"{g.id.role} group {g.name}: {gate.message}"))


def _paused_message(states: Mapping[str, GroupState], summary: str) -> str:
    waiting = sum(s is GroupState.OUTDATED for s in states.values())
    return f"rollout paused (spec.rollout.paused): {waiting} group(s) of an older revision wait to be replaced; " \
           f"replacements already started finish and are verified ({summary}); `pdfleet rollout resume` continues"


def _router_views(observed: Observed, routers: Mapping[str, RouterView],
                  previous: InferencePoolStatus) -> list[RouterView]:
    """The views of router pods that exist and are not terminating, by name. A router this process has not read yet
    (it has just started, or the pod is new to it) keeps what the status last said of it: an operator restarted
    over a converged pool must not write the status twice (without the routers, then with them again)."""
    live = {p["metadata"]["name"] for p in observed.routers if not p["metadata"].get("deletionTimestamp")}
    said = {r.name: _said(r) for r in previous.routers}
    return [routers.get(name) or said[name] for name in sorted(live & (set(routers) | set(said)))]


def _said(router: RouterStatus) -> RouterView:
    """A router's view as its status entry says it: the counts only (no URL is kept in the status)."""
    return RouterView(router.name, {str(Role.PREFILL): router.available_prefill,
                                    str(Role.DECODE): router.available_decode},
                      ("",) * router.open_circuits, ("",) * router.missing_workers)


def _router_available(spec: InferencePoolSpec, observed: Observed, views: list[RouterView]) -> bool:
    """A router Deployment has an available pod and, once the operator has read what its routers can route to, at
    least one router can reach a worker of each role (one that cannot answers every request 503)."""
    if spec.router.replicas == 0:
        return True
    if views and all(v.lacking for v in views):
        return False
    return any((d.get("status") or {}).get("availableReplicas", 0) >= 1 for d in observed.of_kind("Deployment"))


def _routers_lacking(views: list[RouterView]) -> str:
    lacking = [f"router {v.router} has no available {' or '.join(v.lacking)} worker" for v in views if v.lacking]
    lacking += [f"router {v.router} does not list {len(v.missing)} worker(s) in rotation yet" for v in views
                if v.missing]
    return f" ({'; '.join(lacking)})" if lacking else ""


def _accepted(conditions: Iterable[Condition], generation: int | None, now: datetime.datetime) -> Condition:
    return status_writes.condition(conditions, ConditionType.ACCEPTED, True, "Valid", "the spec passed every check",
                                generation=generation, now=now)


def _paused_status(previous: InferencePoolStatus, generation: int | None,
                   now: datetime.datetime) -> InferencePoolStatus:
    # Accepted too: a pool refused, then mended and paused, would otherwise keep the refusal it no longer earns.
    conds = [_accepted(previous.conditions, generation, now),
             status_writes.condition(previous.conditions, ConditionType.PROGRESSING, False, "Paused",
                                  "the pool is paused: nothing is created, replaced or restarted",
                                  generation=generation, now=now)]
    return previous.model_copy(update={"phase": Phase.PAUSED, "observed_generation": generation,
                                       "conditions": status_writes.merge_conditions(previous.conditions, conds)})


def _status_only(pool: Body, previous: InferencePoolStatus, new: InferencePoolStatus,
                 events: tuple[Event, ...] = ()) -> Plan:
    return Plan(status=status_writes.wire(new) if status_writes.changed(new, pool.get("status")) else None,
                events=events)


@dataclasses.dataclass(frozen=True)
class Rejection:
    """Why a spec is not acted on: the Accepted condition's reason and the Warning's."""

    condition: str
    event: str


INVALID_SPEC = Rejection("InvalidSpec", "SpecRejected")
# The spec is valid, but asks for what the cluster admin's pool policy does not allow (api/pool_policy.py).
REFUSED_BY_POLICY = Rejection("ForbiddenByPolicy", "PolicyRefused")


def _rejected_plan(pool: Body, previous: InferencePoolStatus, problems: list[checks.Problem],
                   generation: int | None, now: datetime.datetime, *, reason: Rejection = INVALID_SPEC) -> Plan:
    message = "; ".join(str(p) for p in problems[:10]) or "the spec could not be read"
    cond = status_writes.condition(previous.conditions, ConditionType.ACCEPTED, False, reason.condition, message,
                                generation=generation, now=now)
    new = previous.model_copy(update={"observed_generation": generation,
                                      "conditions": status_writes.merge_conditions(previous.conditions, [cond])})
    before = next((c for c in previous.conditions if c.type == ConditionType.ACCEPTED), None)
    events: tuple[Event, ...] = ()
    if before is None or before.status != "False" or before.message != message:
        events = (Event("Warning", reason.event, f"nothing in the fleet was changed: {message}"),)
    return dataclasses.replace(_status_only(pool, previous, new, events), rejected=True)
