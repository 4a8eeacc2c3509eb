"""Gang scheduling through Kueue (`scheduling.gang`, `scheduling.topology`): what an engine pod carries for
Kueue v0.17's pod integration, and that Kueue's own changes to a pod are not drift. Pure: no cluster."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.planning.groups import Expectations, GroupState, classify
from pdfleet.operator.render import desired, gang, revision
from pdfleet.operator.render.context import RenderContext
from pdfleet.operator.render.desired import DesiredGroup
from tests.support.pools import pool_body

CTX = RenderContext(pool="p", namespace="ns", uid="u1")
KUEUE = {"gang": {"queueName": "gpus"}}


def spec_of(**updates: Any) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate(pool_body(base="multinode-decode", **updates)["spec"])


def groups_of(spec: InferencePoolSpec, role: Role = Role.DECODE) -> list[DesiredGroup]:
    return [g for g in desired.desired(CTX, spec).groups if g.id.role is role]


def kueue_keys(mapping: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in mapping.items() if k.startswith("kueue.x-k8s.io/")}


@pytest.mark.effect("spec.*.scheduling.gang.queueName", "spec.*.scheduling.gang.scheduler")
@pytest.mark.parametrize("role", list(Role))
def test_every_pod_of_a_group_names_its_queue_its_gang_and_the_gang_size(role: Role) -> None:
    spec = spec_of(**{f"{role}__scheduling": KUEUE, f"{role}__replicas": 2})
    groups = groups_of(spec, role)
    rev = revision.role_revision(spec, role)
    assert spec.decode.nodes_per_group > 1  # the example's decode groups are two pods, its prefill groups one
    for group in groups:
        for pod in group.pods:
            assert kueue_keys(pod["metadata"]["labels"]) == {
                "kueue.x-k8s.io/queue-name": "gpus",
                "kueue.x-k8s.io/pod-group-name": f"{group.name}-{rev}"}
            assert kueue_keys(pod["metadata"]["annotations"]) == {
                "kueue.x-k8s.io/pod-group-total-count": str(spec.role(role).nodes_per_group),
                "kueue.x-k8s.io/pod-group-serving": "true"}
    assert len({g.pods[0]["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for g in groups}) == 2


def test_without_gang_a_pod_carries_nothing_for_kueue() -> None:
    for group in groups_of(spec_of()):
        for pod in group.pods:
            assert not kueue_keys(pod["metadata"]["labels"]) and not kueue_keys(pod["metadata"]["annotations"])
            assert "schedulingGates" not in pod["spec"] and "schedulerName" not in pod["spec"]


def test_a_new_revision_is_a_new_gang_of_the_same_pod_names() -> None:
    """A rollout replaces a group by pods of the same names; their Kueue group (and Workload) is new."""
    before = groups_of(spec_of(decode__scheduling=KUEUE))[0]
    after = groups_of(spec_of(decode__scheduling=KUEUE, engine__extraArgs=["--mem-fraction-static", "0.8"]))[0]
    assert [p["metadata"]["name"] for p in before.pods] == [p["metadata"]["name"] for p in after.pods]
    names = {g.pods[0]["metadata"]["labels"][gang.GROUP_LABEL] for g in (before, after)}
    assert len(names) == 2


def test_a_gang_name_fits_a_label_value_at_the_longest_group_name() -> None:
    group = "p" * 40 + "-prefill-1023"
    name = gang.pod_group_name(group, "0123456789")
    assert len(name) == gang.LABEL_VALUE_MAX and name.endswith("-0123456789")
    assert name != gang.pod_group_name("p" * 40 + "-prefill-1022", "0123456789")
    assert gang.pod_group_name("p-decode-0", "0123456789") == "p-decode-0-0123456789"


@pytest.mark.effect("spec.*.scheduling.topology.nodeLabel", "spec.*.scheduling.topology.mode")
@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize(("mode", "annotation"), [
    ("Required", "kueue.x-k8s.io/podset-required-topology"),
    ("Preferred", "kueue.x-k8s.io/podset-preferred-topology"),
])
def test_topology_asks_kueue_for_one_domain_of_the_node_label(role: Role, mode: str, annotation: str) -> None:
    topology = {"nodeLabel": "nvidia.com/gpu.clique", "mode": mode}
    spec = spec_of(**{f"{role}__scheduling": {**KUEUE, "topology": topology}})
    for pod in groups_of(spec, role)[0].pods:
        notes = kueue_keys(pod["metadata"]["annotations"])
        assert notes[annotation] == "nvidia.com/gpu.clique"
        assert len([k for k in notes if "topology" in k]) == 1


def test_the_pods_of_a_group_are_one_kueue_pod_set() -> None:
    """Kueue v0.17 splits a pod group into pod sets by a hash of each pod's containers' requests and ports,
    node selector, affinity, tolerations, priority, runtime class, overhead, spread and claims
    (pkg/util/pod.SpecShape); a topology request holds per pod set. Every node rank must hash alike, or a
    two-pod group would be two one-pod sets, each trivially inside a domain of its own."""
    spec = spec_of(decode__scheduling={**KUEUE, "topology": {"nodeLabel": "nvidia.com/gpu.clique"}})

    def shape(pod: dict[str, Any]) -> dict[str, Any]:
        s = pod["spec"]
        return {"containers": [(c.get("resources", {}).get("requests"), c.get("ports")) for c in s["containers"]],
                "init": [(c.get("resources", {}).get("requests"), c.get("ports")) for c in s["initContainers"]],
                **{k: s.get(k) for k in ("nodeSelector", "affinity", "tolerations", "priority", "runtimeClassName",
                                         "topologySpreadConstraints", "overhead", "resourceClaims")}}

    pods = groups_of(spec)[0].pods
    assert len(pods) > 1 and all(shape(p) == shape(pods[0]) for p in pods)


def admitted_by_kueue(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as Kueue leaves it once admitted: its finalizer, its managed label, its flavor's node selector
    and tolerations and the topology ungater's hostname pin (the gates are gone again)."""
    out = copy.deepcopy(pod)
    out["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
    out["metadata"].setdefault("finalizers", []).append("kueue.x-k8s.io/managed")
    out["metadata"]["labels"]["kueue.x-k8s.io/managed"] = "true"
    out["spec"]["nodeSelector"] = {**out["spec"]["nodeSelector"], "pool": "gpu-a",
                                   "kubernetes.io/hostname": "node-1"}
    out["spec"]["tolerations"] = [*out["spec"]["tolerations"], {"key": "pool", "operator": "Exists"}]
    out["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return out


def gated_by_kueue(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["metadata"].setdefault("finalizers", []).append("kueue.x-k8s.io/managed")
    out["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}, {"name": "kueue.x-k8s.io/topology"}]
    out["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
    return out


def test_what_kueue_changes_on_a_pod_is_not_drift() -> None:
    """classify compares the applied-hash annotation only: a gated pod is a group Starting, an admitted one Ready,
    never Outdated (which would replace the group, and the new one would be gated again, for ever)."""
    group = groups_of(spec_of(decode__scheduling=KUEUE))[0]
    assert classify(group, [gated_by_kueue(p) for p in group.pods], Expectations()) is GroupState.STARTING
    assert classify(group, [admitted_by_kueue(p) for p in group.pods], Expectations()) is GroupState.READY
