"""What a health poll reads from engines (operator/planning/health/engine_reads.py), decided without I/O. The monitor's
tests (test_monitor_server_info.py, test_monitor_bake.py, test_engine_load_sim.py) show the reads done over HTTP."""

from __future__ import annotations

import copy
from typing import Any

from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import InferencePoolStatus
from pdfleet.operator.planning.groups import pods_by_group
from pdfleet.operator.planning.health.engine_reads import engine_reads
from pdfleet.operator.render import desired, labels
from pdfleet.operator.render.context import RenderContext
from tests.support.pools import pool_body

Body = dict[str, Any]


def fleet(**updates: Any) -> tuple[InferencePoolSpec, dict[str, list[Body]]]:
    """The pool's rendered pods, each Ready with a uid and an address, by group."""
    body = pool_body(**updates)
    spec = InferencePoolSpec.model_validate(body["spec"])
    pods = []
    for index, pod in enumerate(p for g in desired.desired(RenderContext.of(body), spec).groups for p in g.pods):
        pod = copy.deepcopy(pod)
        pod["metadata"]["uid"] = f"uid-{index}"
        pod["status"] = {"phase": "Running", "podIP": f"127.0.0.{index + 2}",
                         "conditions": [{"type": "Ready", "status": "True"}]}
        pods.append(pod)
    return spec, pods_by_group(pods)


def uids(leaders: Any) -> list[str]:
    return sorted(pod["metadata"]["uid"] for pod, _ in leaders)


def test_server_info_is_asked_once_of_each_update_revision_leader_and_never_of_a_foreign_one() -> None:
    spec, groups = fleet()
    reads = engine_reads(spec, groups, InferencePoolStatus(), known=set(), foreign=set())
    assert uids(reads.server_info) == ["uid-0", "uid-1"] and not reads.sampled and not reads.loaded
    assert engine_reads(spec, groups, InferencePoolStatus(), known={"uid-0"}, foreign=set()).server_info[0][0][
        "metadata"]["uid"] == "uid-1"
    assert engine_reads(spec, groups, InferencePoolStatus(), known=set(), foreign={"uid-0", "uid-1"}) == \
        engine_reads(spec, {}, InferencePoolStatus(), known=set(), foreign=set())


def test_a_group_of_another_revision_or_not_ready_is_not_asked() -> None:
    spec, groups = fleet()
    for pods in groups.values():
        pods[0]["metadata"]["labels"][labels.REVISION] = "old"
    assert engine_reads(spec, groups, InferencePoolStatus(), known=set(), foreign=set()).server_info == ()
    spec, groups = fleet()
    for pods in groups.values():
        pods[0]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert not engine_reads(spec, groups, InferencePoolStatus(), known=set(), foreign=set()).any


def test_loads_are_read_for_autoscaled_roles_and_recorded_as_asked_answered_or_not() -> None:
    spec, groups = fleet(autoscaling={"decode": {"maxReplicas": 2, "targets": {"kvCacheUsage": "0.8"}}})
    reads = engine_reads(spec, groups, InferencePoolStatus(), known=set(), foreign=set())
    [decode] = [name for name in groups if "-decode-" in name]
    assert reads.asked == {decode} and list(reads.loaded) == [decode]
    foreign = {pods[0]["metadata"]["uid"] for pods in groups.values()}
    assert engine_reads(spec, groups, InferencePoolStatus(), known=set(), foreign=foreign).asked == {decode}


def test_the_canary_goes_to_decode_leaders_not_verified_at_their_revision() -> None:
    spec, groups = fleet(model__toolCallParser="deepseekv32", rollout={"verification": {"toolCallCanary": True}})
    [decode] = [name for name in groups if "-decode-" in name]
    reads = engine_reads(spec, groups, InferencePoolStatus(), known=set(), foreign=set())
    assert [p["metadata"]["name"] for p in reads.canary] == [groups[decode][0]["metadata"]["name"]]
    revision = groups[decode][0]["metadata"]["labels"][labels.REVISION]
    verified = InferencePoolStatus.model_validate({"groups": [{"name": decode, "role": "decode", "revision": revision,
                                                                "verifiedRevision": revision}]})
    assert engine_reads(spec, groups, verified, known=set(), foreign=set()).canary == ()


def test_each_leader_s_metrics_are_read_once_whoever_reads_them() -> None:
    spec, groups = fleet(autoscaling={"decode": {"maxReplicas": 2, "targets": {"kvCacheUsage": "0.8"}}})
    reads = engine_reads(spec, groups, InferencePoolStatus(), known=set(), foreign=set())
    both = type(reads)(sampled=tuple(reads.loaded.values()), loaded=reads.loaded)
    assert list(both.metrics()) == [pod["metadata"]["uid"] for pod, _ in reads.loaded.values()]
