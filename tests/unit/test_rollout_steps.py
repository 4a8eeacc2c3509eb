"""The rollout's step function walked through whole rollouts, as LeaderWorkerSet's rolling-update tests walk every
step: each group of the old revision is replaced (missing, starting, Ready, then verified or failed), and the
table says which groups each step replaces."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.rollout import RolloutSpec
from pdfleet.operator.planning.groups import GroupState as S
from pdfleet.operator.planning.rollout import rollout_plan

D, P = Role.DECODE, Role.PREFILL
NEXT = {S.MISSING: S.STARTING, S.STARTING: S.READY}  # what a replaced group becomes at each step


@dataclasses.dataclass
class Walk:
    steps: list[tuple[str, ...]]  # what each step replaced (empty steps left out)
    stopped: bool
    states: dict[str, S]


def walk(policy: dict, groups: dict[str, Role], *, verifies: Callable[[str], bool] = lambda name: True,
         sick: dict[str, S] | None = None, pause_after: int | None = None, limit: int = 60) -> Walk:
    """Steps until nothing changes. A replaced group goes missing -> starting -> Ready -> verified (or, when
    `verifies(name)` is False, stays unverified and stops the rollout); `sick`: old groups in a state of their
    own."""
    spec = RolloutSpec.model_validate(policy)
    states = {name: S.OUTDATED for name in groups} | (sick or {})
    verified: dict[str, bool] = {name: False for name in groups}
    stopped = False
    steps: list[tuple[str, ...]] = []
    for _ in range(limit):
        if pause_after is not None and len(steps) == pause_after:
            spec = spec.model_copy(update={"paused": True})
        seen = [rollout_plan.Group(n, groups[n], states[n], verified[n]) for n in groups]
        picked = rollout_plan.step(spec, seen, stopped=stopped).replace
        if picked:
            steps.append(picked)
        moved = False
        for name in groups:
            if name in picked:
                states[name], moved = S.MISSING, True
            elif states[name] in NEXT:
                states[name], moved = NEXT[states[name]], True
            elif states[name] is S.READY and not verified[name] and not stopped:
                if verifies(name):
                    verified[name] = moved = True
                else:
                    stopped = moved = True
        if not moved:
            return Walk(steps, stopped, states)
    raise AssertionError(f"no end in {limit} steps: {steps}")


GROUPS = {"d0": D, "d1": D, "d2": D, "p0": P, "p1": P}


@pytest.mark.parametrize(("policy", "steps"), [
    ({}, [("d0",), ("d1",), ("d2",), ("p0",), ("p1",)]),
    ({"maxUnavailable": {"decode": 2}}, [("d0",), ("d1", "d2"), ("p0",), ("p1",)]),
    ({"maxUnavailable": {"decode": 3, "prefill": 2}}, [("d0",), ("d1", "d2"), ("p0",), ("p1",)]),
    ({"order": "PrefillFirst", "maxUnavailable": {"prefill": 2}}, [("p0",), ("p1",), ("d0",), ("d1",), ("d2",)]),
], ids=["one-at-a-time", "decode-widens-after-its-canary", "every-role-has-a-canary", "prefill-first"])
def test_a_good_rollout_goes_canary_first_then_widens_role_after_role(policy: dict,
                                                                      steps: list[tuple[str, ...]]) -> None:
    done = walk(policy, GROUPS)
    assert done.steps == steps
    assert not done.stopped and all(s is S.READY for s in done.states.values())
    assert sorted(n for s in done.steps for n in s) == sorted(GROUPS), "each group replaced once"


def test_a_bad_canary_is_the_only_group_that_ever_runs_the_revision() -> None:
    done = walk({"maxUnavailable": {"decode": 3, "prefill": 2}}, GROUPS, verifies=lambda name: False)
    assert done.steps == [("d0",)] and done.stopped


def test_a_revision_bad_after_widening_stops_with_the_groups_of_that_step() -> None:
    done = walk({"maxUnavailable": {"decode": 2}}, GROUPS, verifies=lambda name: name == "d0")
    assert done.steps == [("d0",), ("d1", "d2")] and done.stopped, "the prefill role never starts"


def test_a_pause_starts_nothing_more_and_lets_the_step_in_flight_finish() -> None:
    done = walk({}, GROUPS, pause_after=2)
    assert done.steps == [("d0",), ("d1",)]
    assert done.states["d1"] is S.READY and done.states["d2"] is S.OUTDATED


def test_an_old_group_out_of_service_counts_against_max_unavailable() -> None:
    # d2 (old revision) is restarting: with maxUnavailable 1 nothing else of decode goes until it is back.
    seen = [rollout_plan.Group("d0", D, S.OUTDATED, False), rollout_plan.Group("d1", D, S.OUTDATED, False),
            rollout_plan.Group("d2", D, S.STARTING, False), rollout_plan.Group("p0", P, S.OUTDATED, False)]
    assert rollout_plan.step(RolloutSpec(), seen, stopped=False).replace == ()
    back = [*seen[:2], dataclasses.replace(seen[2], state=S.READY, verified=True), seen[3]]
    assert rollout_plan.step(RolloutSpec(), back, stopped=False).replace == ("d0",)


def test_the_same_observation_gives_the_same_step_so_a_restarted_operator_replaces_no_group_twice() -> None:
    # Mid-bake: d0 replaced, Ready, not verified yet. Whatever process plans next sees this and waits.
    seen = [rollout_plan.Group("d0", D, S.READY, False), rollout_plan.Group("d1", D, S.OUTDATED, False),
            rollout_plan.Group("p0", P, S.OUTDATED, False)]
    policy = RolloutSpec.model_validate({"maxUnavailable": {"decode": 2, "prefill": 2}})
    assert rollout_plan.step(policy, seen, stopped=False).replace == ()
    assert rollout_plan.step(policy, list(reversed(seen)), stopped=False).replace == ()


def test_a_stopped_rollout_replaces_nothing() -> None:
    seen = [rollout_plan.Group(n, r, S.OUTDATED, False) for n, r in GROUPS.items()]
    assert rollout_plan.step(RolloutSpec(), seen, stopped=True).replace == ()
