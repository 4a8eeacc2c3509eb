"""A role's placement relative to itself and to the other role (`scheduling.spread`, `scheduling.near`): the
topologySpreadConstraint and the preferred pod-affinity term on every engine pod of the role, the user's own
affinity kept and never changed, nothing at all when neither is set, and a change of either being a new revision
(a rollout). Pure: no cluster; tests/integration/test_placement_e2e.py shows what kube-scheduler does with them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.planning.groups import Expectations, GroupState, classify
from pdfleet.operator.render import desired, labels, revision
from pdfleet.operator.render.context import RenderContext
from tests.support.pools import pool_body

CTX = RenderContext(pool="p", namespace="ns", uid="u1")
ZONE = "topology.kubernetes.io/zone"
RACK = "example.com/rack"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
# A preferred pod-affinity term of the user's own, next to the example's podAntiAffinity on decode.
USER_TERM = {"weight": 7, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "kv-store"}},
                                              "topologyKey": "kubernetes.io/hostname"}}


def spec_of(**updates: Any) -> InferencePoolSpec:
    """The multi-node example (decode groups of two pods, with a user podAntiAffinity), two groups a role."""
    return InferencePoolSpec.model_validate(pool_body(base="multinode-decode", prefill=2, decode=2, **updates)["spec"])


def scheduling(role: Role, **fields: Any) -> dict[str, Any]:
    """`pool_body` updates replacing the role's `scheduling` by the example's own plus `fields`."""
    base = copy.deepcopy(pool_body(base="multinode-decode")["spec"][str(role)].get("scheduling") or {})
    return {f"{role}__scheduling": {**base, **fields}}


def pods_of(spec: InferencePoolSpec, role: Role) -> list[dict[str, Any]]:
    return [p for g in desired.desired(CTX, spec).groups if g.id.role is role for p in g.pods]


def matches(selector: dict[str, Any], pod: dict[str, Any]) -> bool:
    assert set(selector) == {"matchLabels"}, selector
    return selector["matchLabels"].items() <= pod["metadata"]["labels"].items()


@pytest.mark.effect("spec.*.scheduling.spread.nodeLabel", "spec.*.scheduling.spread.mode")
@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize(("mode", "when"), [("Preferred", "ScheduleAnyway"), ("Required", "DoNotSchedule")])
def test_spread_puts_one_constraint_on_every_pod_of_the_role_counting_the_groups_first_pods(
        role: Role, mode: str, when: str) -> None:
    spec = spec_of(**scheduling(role, spread={"nodeLabel": ZONE, "mode": mode}))
    pods = pods_of(spec, role)
    other = pods_of(spec, Role.PREFILL if role is Role.DECODE else Role.DECODE)
    assert {len(p["spec"]["topologySpreadConstraints"]) for p in pods} == {1}
    constraint = pods[0]["spec"]["topologySpreadConstraints"][0]
    assert constraint == {
        "maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": when,
        "labelSelector": {"matchLabels": {labels.MANAGED_BY: labels.MANAGER, labels.POOL: "p",
                                          labels.ROLE: str(role), labels.RANK: "0"}},
        "matchLabelKeys": [labels.REVISION], "nodeTaintsPolicy": "Honor"}
    assert all(p["spec"]["topologySpreadConstraints"] == [constraint] for p in pods), \
        "every node rank alike: one Kueue pod set per group"
    # The selector names labels the pods carry: each group counts once, by its node rank 0, and only this role.
    counted = [p["metadata"]["name"] for p in pods if matches(constraint["labelSelector"], p)]
    assert counted == [f"p-{role}-0-0", f"p-{role}-1-0"], counted
    assert not any(matches(constraint["labelSelector"], p) for p in other)
    assert all(labels.REVISION in p["metadata"]["labels"] for p in pods)
    assert not any("topologySpreadConstraints" in p["spec"] for p in other)


def test_spread_defaults_to_preferred() -> None:
    [constraint] = pods_of(spec_of(**scheduling(Role.DECODE, spread={"nodeLabel": ZONE})),
                           Role.DECODE)[0]["spec"]["topologySpreadConstraints"]
    assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"


@pytest.mark.effect("spec.*.scheduling.near.role", "spec.*.scheduling.near.nodeLabel",
                    "spec.*.scheduling.near.weight")
def test_near_appends_a_preferred_pod_affinity_term_to_the_users_affinity_without_changing_the_spec() -> None:
    near = {"role": "prefill", "nodeLabel": RACK, "weight": 40}
    spec = spec_of(**scheduling(Role.DECODE, near=near,
                                affinity={**pool_body(base="multinode-decode")["spec"]["decode"]["scheduling"]
                                          ["affinity"], "podAffinity": {PREFERRED: [USER_TERM]}}))
    users = copy.deepcopy(spec.decode.scheduling.affinity)
    assert users is not None and users["podAntiAffinity"]
    ours = {"weight": 40, "podAffinityTerm": {
        "labelSelector": {"matchLabels": {labels.MANAGED_BY: labels.MANAGER, labels.POOL: "p",
                                          labels.ROLE: "prefill"}},
        "topologyKey": RACK}}
    for _ in range(2):  # a second render must not find the first's term in the spec
        for pod in pods_of(spec, Role.DECODE):
            affinity = pod["spec"]["affinity"]
            assert affinity["podAntiAffinity"] == users["podAntiAffinity"], "the user's terms are kept"
            assert affinity["podAffinity"][PREFERRED] == [USER_TERM, ours]
    assert spec.decode.scheduling.affinity == users, "the spec is not changed"
    term = ours["podAffinityTerm"]["labelSelector"]
    assert all(matches(term, p) for p in pods_of(spec, Role.PREFILL)), "it names the other role's pods"
    assert not any(matches(term, p) for p in pods_of(spec, Role.DECODE))
    assert "podAffinity" not in (pods_of(spec, Role.PREFILL)[0]["spec"].get("affinity") or {})


def test_near_without_an_affinity_of_the_users_is_the_whole_affinity_at_weight_100() -> None:
    spec = spec_of(prefill__scheduling={"near": {"role": "decode", "nodeLabel": RACK}})
    for pod in pods_of(spec, Role.PREFILL):
        assert pod["spec"]["affinity"] == {"podAffinity": {PREFERRED: [{"weight": 100, "podAffinityTerm": {
            "labelSelector": {"matchLabels": {labels.MANAGED_BY: labels.MANAGER, labels.POOL: "p",
                                              labels.ROLE: "decode"}},
            "topologyKey": RACK}}]}}
    assert spec.prefill.scheduling.affinity is None


def test_without_spread_or_near_the_pods_are_what_they_were() -> None:
    """Both unset (every pool before them): no constraint, the user's affinity passed through as it is, and
    nothing in the spec's dump, which the revision hashes, so no pool rolls out for them."""
    spec = spec_of()
    for role in Role:
        assert spec.role(role).scheduling.spread is None and spec.role(role).scheduling.near is None
        dumped = spec.role(role).model_dump(mode="json")["scheduling"]
        assert "spread" not in dumped and "near" not in dumped
        for pod in pods_of(spec, role):
            assert "topologySpreadConstraints" not in pod["spec"]
            assert pod["spec"].get("affinity") == spec.role(role).scheduling.affinity
    assert pods_of(spec, Role.DECODE)[0]["spec"]["affinity"] is spec.decode.scheduling.affinity, \
        "passed through as before, not a copy of it"


@pytest.mark.parametrize("change", [
    pytest.param({"spread": {"nodeLabel": ZONE, "mode": "Required"}}, id="spread required"),
    pytest.param({"spread": {"nodeLabel": RACK}}, id="spread over another label"),
    pytest.param({"spread": None}, id="spread removed"),
    pytest.param({"near": {"role": "prefill", "nodeLabel": RACK, "weight": 50}}, id="near weight"),
    pytest.param({"near": {"role": "prefill", "nodeLabel": ZONE}}, id="near another label"),
    pytest.param({"near": None}, id="near removed"),
])
def test_a_change_of_placement_is_a_new_revision_of_that_role_alone(change: dict[str, Any]) -> None:
    """A pod's affinity and spread cannot change in place: the role's groups are replaced through a rollout."""
    placed = {"spread": {"nodeLabel": ZONE}, "near": {"role": "prefill", "nodeLabel": RACK}}
    before = spec_of(**scheduling(Role.DECODE, **placed))
    after = spec_of(**scheduling(Role.DECODE, **{**placed, **change}))
    assert revision.role_revision(after, Role.DECODE) != revision.role_revision(before, Role.DECODE)
    assert revision.role_revision(after, Role.PREFILL) == revision.role_revision(before, Role.PREFILL)
    assert pods_of(after, Role.DECODE)[0]["metadata"]["labels"][labels.REVISION] != \
        pods_of(before, Role.DECODE)[0]["metadata"]["labels"][labels.REVISION]


def test_setting_placement_on_a_pool_without_it_is_a_new_revision() -> None:
    plain = spec_of()
    for role, other in ((Role.PREFILL, Role.DECODE), (Role.DECODE, Role.PREFILL)):
        for fields in ({"spread": {"nodeLabel": ZONE}}, {"near": {"role": str(other), "nodeLabel": RACK}}):
            placed = spec_of(**scheduling(role, **fields))
            assert revision.role_revision(placed, role) != revision.role_revision(plain, role)
            assert revision.role_revision(placed, other) == revision.role_revision(plain, other)


def test_with_gang_and_a_preferred_spread_a_groups_pods_stay_one_kueue_pod_set() -> None:
    """Kueue v0.17 splits a pod group into pod sets by each pod's scheduling shape, spread and affinity included
    (tests/unit/test_render_gang.py): both node ranks carry the same constraint and terms."""
    spec = spec_of(**scheduling(Role.DECODE, gang={"queueName": "gpus"},
                                topology={"nodeLabel": "nvidia.com/gpu.clique"},
                                spread={"nodeLabel": ZONE}, near={"role": "prefill", "nodeLabel": RACK}))
    groups = [g for g in desired.desired(CTX, spec).groups if g.id.role is Role.DECODE]
    for group in groups:
        first, second = group.pods
        for key in ("topologySpreadConstraints", "affinity", "nodeSelector", "tolerations"):
            assert first["spec"][key] == second["spec"][key], key


def stored_by_the_apiserver(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as kube-apiserver v1.34 stores it, running: it merges each matchLabelKeys key into the constraint's
    labelSelector as an `In` expression on the pod's own value (measured on the local cluster)."""
    out = copy.deepcopy(pod)
    out["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
    for constraint in out["spec"].get("topologySpreadConstraints", []):
        constraint["labelSelector"]["matchExpressions"] = [
            {"key": key, "operator": "In", "values": [pod["metadata"]["labels"][key]]}
            for key in constraint["matchLabelKeys"]]
    out["spec"]["nodeName"] = "node-1"
    out["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return out


def test_the_apiservers_merge_of_match_label_keys_is_not_drift() -> None:
    """The planner compares its applied-hash annotation only: the selector the apiserver rewrites never replaces
    a group (on the local cluster a pool's spread pods kept their uids over 10 s of 1 s resyncs)."""
    spec = spec_of(**scheduling(Role.DECODE, spread={"nodeLabel": ZONE, "mode": "Required"}))
    for group in desired.desired(CTX, spec).groups:
        stored = [stored_by_the_apiserver(p) for p in group.pods]
        assert classify(group, stored, Expectations()) is GroupState.READY
