"""InferencePoolRole mirroring (`planning.scale.role_scale_plan`), pure: which side moved, what is written where, and
that the two sides settle after one round of writes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pdfleet.operator.api.role_scale import InferencePoolRole
from pdfleet.operator.api.roles import Role
from pdfleet.operator.planning import spec_change
from pdfleet.operator.planning.scale import role_scale_plan

Body = dict[str, Any]


def pool(*, prefill: int = 1, decode: int = 1, target: tuple[Role, ...] = (Role.DECODE,), paused: bool = False,
         generation: int = 4) -> Body:
    return {
        "apiVersion": "pdfleet.dev/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "generation": generation},
        "spec": {"paused": paused,
                 "prefill": {"replicas": prefill, "scaleTarget": Role.PREFILL in target},
                 "decode": {"replicas": decode, "scaleTarget": Role.DECODE in target}},
        "status": {"groups": [{"name": "p-decode-0", "role": "decode"}, {"name": "p-prefill-0", "role": "prefill"},
                              {"name": "p-decode-1", "role": "decode"}],
                   "decode": {"ready": 1}, "prefill": {"ready": 1}},
    }


def role_object(replicas: int, *, generation: int, observed: int | None, role: Role = Role.DECODE,
                **status: Any) -> Body:
    body = role_scale_plan.desired_object(pool(), role)
    body["metadata"].update(generation=generation, resourceVersion="77", uid="r-1")
    body["spec"]["replicas"] = replicas
    body["status"] = {"replicas": 2, "readyReplicas": 1, "selector": role_scale_plan.selector("p", role), **status}
    if observed is not None:
        body["status"]["observedGeneration"] = observed
    return body


def test_a_role_that_is_no_scale_target_gets_nothing() -> None:
    assert role_scale_plan.plan(pool(target=()), []) == role_scale_plan.RoleScalePlan()


def test_a_scale_target_gets_an_inference_pool_role_owned_by_the_pool_at_its_replicas() -> None:
    plan = role_scale_plan.plan(pool(decode=3), [])
    [step] = plan.steps
    assert step.role is Role.DECODE and step.name == "p-decode"
    created = InferencePoolRole.model_validate(step.create)  # the API model accepts what is created
    assert created.spec.replicas == 3 and created.spec.pool == "p"
    [owner] = step.create["metadata"]["ownerReferences"]  # type: ignore[index]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("InferencePool", "p", "u-1", True)
    selector = "app.kubernetes.io/managed-by=pdfleet,pdfleet.dev/pool=p,pdfleet.dev/role=decode"
    assert step.status == {"replicas": 2, "readyReplicas": 1, "selector": selector}
    assert plan.pool_change is None


def test_a_scaled_inference_pool_role_moves_the_pools_replicas_guarded_by_its_generation() -> None:
    plan = role_scale_plan.plan(pool(decode=1), [role_object(3, generation=2, observed=1)])
    assert plan.pool_change is not None
    assert plan.pool_change.ops[0] == {"op": "test", "path": "/metadata/generation", "value": 4}
    assert spec_change.apply(pool(decode=1), plan.pool_change)["spec"]["decode"]["replicas"] == 3
    [step] = plan.steps
    assert step.observed_generation == 2 and step.replicas is None
    [event] = plan.events
    assert (event.type, event.reason) == ("Normal", "RoleScaled") and "decode replicas 1 -> 3" in event.message
    assert plan.results == ((Role.DECODE, "taken"),)


def test_an_edit_of_the_pools_replicas_is_written_into_the_inference_pool_role() -> None:
    plan = role_scale_plan.plan(pool(decode=4), [role_object(2, generation=2, observed=2)])
    assert plan.pool_change is None and not plan.events
    [step] = plan.steps
    assert (step.replicas, step.resource_version, step.observed_generation) == (4, "77", None)


def test_when_both_moved_the_scale_wins() -> None:
    plan = role_scale_plan.plan(pool(decode=4), [role_object(2, generation=3, observed=2)])
    assert plan.pool_change is not None
    assert spec_change.apply(pool(decode=4), plan.pool_change)["spec"]["decode"]["replicas"] == 2


def test_in_step_and_reported_writes_nothing() -> None:
    plan = role_scale_plan.plan(pool(decode=2), [role_object(2, generation=2, observed=2)])
    assert plan == role_scale_plan.RoleScalePlan()


def test_the_status_follows_the_pools_group_counts() -> None:
    stale = role_object(2, generation=2, observed=2)
    stale["status"]["replicas"] = 1  # before the second decode group appeared
    [step] = role_scale_plan.plan(pool(decode=2), [stale]).steps
    assert step.status is not None and step.status["replicas"] == 2 and step.observed_generation == 2


def test_zero_replicas_on_a_running_pool_is_refused_once_and_said() -> None:
    plan = role_scale_plan.plan(pool(decode=1), [role_object(0, generation=2, observed=1)])
    assert plan.pool_change is None
    [step] = plan.steps
    assert "at least 1 unless the pool is paused" in step.status["message"]  # type: ignore[index]
    assert step.observed_generation == 1  # the scale is still ahead of what the pool holds
    [event] = plan.events
    assert (event.type, event.reason) == ("Warning", "ScaleRefused")
    assert plan.results == ((Role.DECODE, "refused"),)
    said = role_object(0, generation=2, observed=1, message=step.status["message"])  # type: ignore[index]
    again = role_scale_plan.plan(pool(decode=1), [said])
    assert not again.events and not again.steps and again.pool_change is None and not again.results


def test_zero_replicas_on_a_paused_pool_is_mirrored() -> None:
    plan = role_scale_plan.plan(pool(decode=1, paused=True), [role_object(0, generation=2, observed=1)])
    assert plan.pool_change is not None


def test_a_role_that_stops_being_a_scale_target_loses_its_inference_pool_role() -> None:
    [step] = role_scale_plan.plan(pool(target=()), [role_object(1, generation=1, observed=1)]).steps
    assert step.delete_uid == "r-1"


@pytest.mark.effect("spec.*.scaleTarget")
def test_one_round_of_writes_settles_both_sides() -> None:
    """Write what the plan says, as the apiserver would store it, and plan again: nothing left to do."""
    current_pool = pool(prefill=1, decode=1, target=(Role.PREFILL, Role.DECODE))
    objects = [role_object(3, generation=2, observed=1),
               role_object(2, generation=5, observed=5, role=Role.PREFILL)]
    plan = role_scale_plan.plan(current_pool, objects)
    assert plan.pool_change is not None
    current_pool = spec_change.apply(current_pool, plan.pool_change)
    current_pool["metadata"]["generation"] += 1
    stored = {o["metadata"]["name"]: copy.deepcopy(o) for o in objects}
    for step in plan.steps:
        body = stored[step.name]
        if step.replicas is not None:
            body["spec"]["replicas"] = step.replicas
            body["metadata"]["generation"] += 1
        if step.status is not None:
            body["status"] = {**step.status, "observedGeneration": step.observed_generation
                              or body["metadata"]["generation"]}
    assert current_pool["spec"]["decode"]["replicas"] == 3
    assert role_scale_plan.plan(current_pool, list(stored.values())) == role_scale_plan.RoleScalePlan()


def banded(on_scale: str, **kwargs: Any) -> Body:
    body = pool(**kwargs)
    body["spec"]["scaling"] = {"ratio": {"minDecodePerPrefill": "1", "maxDecodePerPrefill": "2", "onScale": on_scale}}
    return body


@pytest.mark.effect("spec.scaling.ratio.minDecodePerPrefill", "spec.scaling.ratio.maxDecodePerPrefill",
                    "spec.scaling.ratio.onScale")
def test_a_scale_out_of_the_ratio_band_moves_the_other_role_with_it_and_says_so() -> None:
    plan = role_scale_plan.plan(banded("Follow", prefill=1, decode=2), [role_object(6, generation=2, observed=1)])
    assert plan.pool_change is not None
    stored = spec_change.apply(banded("Follow", prefill=1, decode=2), plan.pool_change)["spec"]
    assert (stored["prefill"]["replicas"], stored["decode"]["replicas"]) == (3, 6)
    [step] = plan.steps
    assert "prefill follows decode to 3" in step.status["message"]  # type: ignore[index]
    [event] = plan.events
    assert "prefill follows decode to 3" in event.message
    assert plan.results == ((Role.DECODE, "followed"),)


@pytest.mark.effect("spec.scaling.ratio.onScale")
def test_a_clamped_scale_is_cut_to_the_band_and_written_back_to_the_inference_pool_role() -> None:
    before = banded("Clamp", prefill=2, decode=2)
    plan = role_scale_plan.plan(before, [role_object(6, generation=2, observed=1)])
    assert plan.pool_change is not None
    after = spec_change.apply(before, plan.pool_change)
    assert (after["spec"]["prefill"]["replicas"], after["spec"]["decode"]["replicas"]) == (2, 4)
    [step] = plan.steps
    assert "decode clamped to 4" in step.status["message"]  # type: ignore[index]
    assert plan.results == ((Role.DECODE, "clamped"),)
    # The InferencePoolRole still asks for 6; its scale was seen, so the next plan writes the pool's 4 back.
    [step] = role_scale_plan.plan(after, [role_object(6, generation=2, observed=2)]).steps
    assert step.replicas == 4


def test_a_paused_pool_holds_no_band() -> None:
    plan = role_scale_plan.plan(banded("Follow", prefill=1, decode=2, paused=True),
                           [role_object(9, generation=2, observed=1)])
    assert plan.pool_change is not None
    stored = spec_change.apply(banded("Follow", prefill=1, decode=2, paused=True), plan.pool_change)["spec"]
    assert (stored["prefill"]["replicas"], stored["decode"]["replicas"]) == (1, 9)
