"""Rollouts with `maxSurge` walked step by step through the rollout's two decisions as the planner takes them
(`rollout.surge`, then `rollout.step` on the groups it kept): how many groups above replicas each role has, which
old groups go, and how many groups serve after every step."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.rollout import RolloutSpec
from pdfleet.operator.planning.groups import GroupState as S
from pdfleet.operator.planning.rollout import rollout_plan

D, P = Role.DECODE, Role.PREFILL
NEXT = {S.MISSING: S.STARTING, S.STARTING: S.READY}


@dataclasses.dataclass
class G:
    role: Role
    state: S
    verified: bool
    surge: bool = False


@dataclasses.dataclass
class Walk:
    steps: list[tuple[str, ...]]  # what each step replaced
    surged: list[str]  # every surge group ever started, in order
    stopped: bool
    groups: dict[str, G]
    least_serving: dict[Role, int]  # the fewest groups of each role that served after any step
    ran: set[str]  # every group that ever ran the new revision


def serving(groups: dict[str, G], role: Role) -> int:
    return sum(1 for g in groups.values() if g.role is role and (g.state is S.OUTDATED or
                                                                  (g.state is S.READY and g.verified)))


def walk(policy: dict, replicas: dict[Role, int], *, verifies: Callable[[str], bool] = lambda name: True,
         unschedulable: frozenset[Role] = frozenset(), limit: int = 80) -> Walk:
    """Ticks until nothing changes. Each tick: the surge decision (new surge groups start missing, unwanted ones
    go), then the step (picked old groups go missing), then every group moves on: missing -> starting -> Ready
    -> verified (or, where `verifies(name)` is False, the rollout stops)."""
    spec = RolloutSpec.model_validate(policy)
    groups = {f"{role[0]}{i}": G(role, S.OUTDATED, False) for role, n in replicas.items() for i in range(n)}
    least = {role: serving(groups, role) for role in replicas}
    stopped, steps, surged, ran = False, [], [], set()

    def seen() -> list[rollout_plan.Group]:
        return [rollout_plan.Group(n, g.role, g.state, g.verified, surge=g.surge) for n, g in groups.items()]

    for _ in range(limit):
        before = {n: dataclasses.replace(g) for n, g in groups.items()}
        counts = rollout_plan.surge(spec, seen(), stopped=stopped, unschedulable=unschedulable)
        for role in replicas:
            extra = sorted(n for n, g in groups.items() if g.role is role and g.surge)
            for name in extra[counts[role]:]:
                del groups[name]
            for k in range(len(extra), counts[role]):
                name = f"{role[0]}{replicas[role] + k}"
                groups[name] = G(role, S.MISSING, False, surge=True)
                surged.append(name)
        picked = rollout_plan.step(spec, seen(), stopped=stopped, unschedulable=unschedulable).replace
        if picked:
            steps.append(picked)
        for name in picked:
            groups[name].state = S.MISSING
        least = {role: min(least[role], serving(groups, role)) for role in replicas}
        for name, g in groups.items():
            if g.state is S.MISSING:
                ran.add(name)
            if g.state in NEXT and name not in picked and name in before:  # one created now starts next tick
                g.state = NEXT[g.state]
            elif g.state is S.READY and not g.verified and not stopped:
                if verifies(name):
                    g.verified = True
                else:
                    stopped = True
        if groups == before:
            return Walk(steps, surged, stopped, groups, least, ran)
    raise AssertionError(f"no end in {limit} ticks: {steps}")


@pytest.mark.parametrize(("policy", "replicas", "steps", "surged"), [
    ({"maxSurge": {"decode": 1, "prefill": 1}}, {D: 2, P: 2},
     [("d0",), ("d1",), ("p0",), ("p1",)], ["d2", "p2"]),
    ({"maxSurge": {"decode": 2}}, {D: 4, P: 1},
     [("d0",), ("d1", "d2"), ("d3",), ("p0",)], ["d4", "d5"]),
    ({"maxSurge": {"decode": 1}}, {D: 1, P: 1}, [("d0",), ("p0",)], ["d1"]),
], ids=["one-each", "decode-widens-to-two-after-its-canary", "one-decode-group"])
def test_with_surge_the_serving_groups_never_drop_below_replicas(policy: dict, replicas: dict[Role, int],
                                                                 steps: list[tuple[str, ...]],
                                                                 surged: list[str]) -> None:
    done = walk(policy, replicas)
    assert done.steps == steps and done.surged == surged
    assert not done.stopped
    surge_roles = {Role(r) for r, n in policy["maxSurge"].items() if n}
    for role in surge_roles:
        assert done.least_serving[role] == replicas[role], f"{role} never below replicas"
    assert all(not g.surge and g.state is S.READY and g.verified for g in done.groups.values()), \
        "the surge groups are gone, every group verified"
    assert sorted(n for s in done.steps for n in s) == sorted(n for n in done.groups), "each old group replaced once"


def test_the_surge_canary_goes_alone_and_bakes_while_every_old_group_serves() -> None:
    spec = RolloutSpec.model_validate({"maxSurge": {"decode": 3}})
    old = [rollout_plan.Group(f"d{i}", D, S.OUTDATED, False) for i in range(4)]
    assert rollout_plan.surge(spec, old, stopped=False) == {D: 1, P: 0}
    canary = rollout_plan.Group("d4", D, S.READY, False, surge=True)  # Ready, baking
    assert rollout_plan.surge(spec, [*old, canary], stopped=False)[D] == 1
    assert rollout_plan.step(spec, [*old, canary], stopped=False).replace == ()
    baked = dataclasses.replace(canary, verified=True)
    assert rollout_plan.surge(spec, [*old, baked], stopped=False)[D] == 3, "widened after the canary"
    assert rollout_plan.step(spec, [*old, baked], stopped=False).replace == ("d0",), "one beyond replicas serves"


def test_a_bad_surge_canary_is_the_only_group_that_ran_the_revision_and_no_old_group_went() -> None:
    done = walk({"maxSurge": {"decode": 2, "prefill": 1}}, {D: 3, P: 2}, verifies=lambda name: False)
    assert done.stopped and done.steps == [] and done.surged == ["d3"]
    assert done.ran == {"d3"}
    assert done.least_serving == {D: 3, P: 2}


def test_a_revision_bad_after_widening_stops_with_what_that_step_started() -> None:
    done = walk({"maxSurge": {"decode": 2}}, {D: 4, P: 1}, verifies=lambda name: name in {"d4"})
    assert done.stopped
    assert done.ran == {"d4", "d5", "d0"}, "the canary, the second surge group and the first old group replaced"
    assert done.least_serving[D] == 4
    assert "d5" in done.groups and "d4" in done.groups, "a stopped rollout keeps its surge groups as they are"


def test_without_schedulable_surge_a_role_replaces_in_place_up_to_max_unavailable() -> None:
    done = walk({"maxSurge": {"decode": 1}, "maxUnavailable": {"decode": 2}}, {D: 3, P: 1},
                unschedulable=frozenset({D}))
    assert done.surged == [] and done.steps == [("d0",), ("d1", "d2"), ("p0",)]
    assert done.least_serving[D] == 1


def test_later_roles_start_no_surge_group_while_an_earlier_role_rolls_out() -> None:
    spec = RolloutSpec.model_validate({"maxSurge": {"decode": 1, "prefill": 1}})
    groups = [rollout_plan.Group("d0", D, S.OUTDATED, False), rollout_plan.Group("p0", P, S.OUTDATED, False)]
    assert rollout_plan.surge(spec, groups, stopped=False) == {D: 1, P: 0}
    prefill_first = spec.model_copy(update={"order": "PrefillFirst"})
    assert rollout_plan.surge(prefill_first, groups, stopped=False) == {D: 0, P: 1}


def test_no_rollout_no_surge_even_while_a_group_restarts() -> None:
    spec = RolloutSpec.model_validate({"maxSurge": {"decode": 1}})
    restarting = [rollout_plan.Group("d0", D, S.MISSING, False), rollout_plan.Group("d1", D, S.READY, True)]
    assert rollout_plan.surge(spec, restarting, stopped=False) == {D: 0, P: 0}
    new_pool = [rollout_plan.Group("d0", D, S.STARTING, False), rollout_plan.Group("d1", D, S.MISSING, False)]
    assert rollout_plan.surge(spec, new_pool, stopped=False) == {D: 0, P: 0}


def test_a_paused_or_stopped_rollout_keeps_its_surge_groups_and_starts_none() -> None:
    spec = RolloutSpec.model_validate({"maxSurge": {"decode": 2}, "paused": True})
    groups = [rollout_plan.Group("d0", D, S.OUTDATED, False), rollout_plan.Group("d1", D, S.OUTDATED, False),
              rollout_plan.Group("d2", D, S.READY, True, surge=True)]
    assert rollout_plan.surge(spec, groups, stopped=False)[D] == 1
    assert rollout_plan.surge(spec.model_copy(update={"paused": False}), groups, stopped=True)[D] == 1
    assert rollout_plan.surge(spec.model_copy(update={"paused": False}), groups, stopped=False)[D] == 2


def test_the_same_observation_gives_the_same_decisions_so_a_restarted_operator_starts_nothing_twice() -> None:
    spec = RolloutSpec.model_validate({"maxSurge": {"decode": 1}})
    groups = [rollout_plan.Group("d0", D, S.MISSING, False), rollout_plan.Group("d1", D, S.OUTDATED, False),
              rollout_plan.Group("d2", D, S.READY, True, surge=True)]
    first = (rollout_plan.surge(spec, groups, stopped=False), rollout_plan.step(spec, groups, stopped=False))
    assert first == (rollout_plan.surge(spec, list(reversed(groups)), stopped=False),
                     rollout_plan.step(spec, groups, stopped=False))
    assert first[1].replace == (), "d0 is being replaced: capacity is at replicas, d1 waits"


def test_a_surge_group_on_its_way_out_holds_neither_its_role_nor_the_next() -> None:
    """Once decode is done its surge group terminates; prefill's rollout starts its own surge group meanwhile and
    keeps it (counting the terminating group as decode still rolling would delete it and make it again)."""
    spec = RolloutSpec.model_validate({"maxSurge": {"decode": 1, "prefill": 1}})
    groups = [rollout_plan.Group("d0", D, S.READY, True), rollout_plan.Group("d1", D, S.READY, True),
              rollout_plan.Group("d2", D, S.TERMINATING, True, surge=True),
              rollout_plan.Group("p0", P, S.OUTDATED, False), rollout_plan.Group("p1", P, S.OUTDATED, False),
              rollout_plan.Group("p2", P, S.STARTING, False, surge=True)]
    assert rollout_plan.surge(spec, groups, stopped=False) == {D: 0, P: 1}
    missing = [dataclasses.replace(g, state=S.MISSING) if g.name == "d2" else g for g in groups]
    assert rollout_plan.surge(spec, missing, stopped=False) == {D: 0, P: 1}
