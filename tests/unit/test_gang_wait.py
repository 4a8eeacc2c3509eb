"""A gang-scheduled group that Kueue has not admitted yet, through the real planner (`FakeCluster`): its status
says it waits for its gang in its queue, one Event says so when it starts waiting, the pool does not count it as
serving, and nothing is deleted while it waits; once admitted and Ready it serves like any group. Pure."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from pdfleet.operator.api.status import InferencePoolStatus
from pdfleet.operator.kube.kube_client import KubeError
from pdfleet.operator.kube.kueue import WorkloadReasons
from pdfleet.operator.planning.scale import gang_wait
from tests.support.pools import pool_body
from tests.unit.test_planning import FakeCluster, reasons

Body = dict[str, Any]
GANG = {"gang": {"queueName": "gpus"}}


def hold_in_kueue(cluster: FakeCluster, group: str) -> None:
    """The group's pods as Kueue's webhook leaves them until their Workload is admitted: gated, Pending."""
    for key, pod in list(cluster.owned.items()):
        if key[0] == "Pod" and pod["metadata"]["labels"]["pdfleet.dev/group"] == group:
            held = copy.deepcopy(pod)
            held["metadata"]["finalizers"] = ["kueue.x-k8s.io/managed"]
            held["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
            held["status"] = {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
            cluster.owned[key] = held


def group_status(cluster: FakeCluster, name: str) -> Body:
    return next(g for g in cluster.pool["status"]["groups"] if g["name"] == name)


def test_a_group_kueue_holds_says_it_waits_for_its_gang_once_and_nothing_is_deleted_meanwhile() -> None:
    cluster = FakeCluster(pool_body(base="multinode-decode", decode=2, decode__scheduling=GANG))
    cluster.converge()
    assert cluster.pool["status"]["phase"] == "Ready"
    hold_in_kueue(cluster, "tiny-decode-1")
    plans = [cluster.step() for _ in range(3)]
    status = group_status(cluster, "tiny-decode-1")
    assert ("waiting for Kueue to admit its gang of 2 pod(s) in queue gpus (spec.decode.scheduling.gang.queueName; "
            "Workload tiny-decode-1-") in \
        status["message"], status
    assert reasons(plans).count(gang_wait.EVENT_REASON) == 1, "one Event when it starts waiting"
    assert cluster.pool["status"]["decode"]["ready"] == 1, "a waiting group does not serve"
    assert not [ref for p in plans for ref in p.delete], "nothing is deleted to make room, nor the waiting group"
    assert "waiting" not in group_status(cluster, "tiny-decode-0").get("message", "")

    for key, pod in cluster.owned.items():  # admitted: ungated, bound and Ready
        if key[0] == "Pod" and pod["spec"].get("schedulingGates"):
            pod["spec"].pop("schedulingGates")
            pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    cluster.converge()
    assert cluster.pool["status"]["decode"]["ready"] == 2 and cluster.pool["status"]["phase"] == "Ready"
    assert not gang_wait.is_waiting(group_status(cluster, "tiny-decode-1").get("message"))


def test_the_waiting_message_carries_kueue_s_reason_and_a_node_wait_names_the_scheduler_s() -> None:
    pod: Body = {"metadata": {"name": "p-decode-0-0", "labels": {"kueue.x-k8s.io/queue-name": "gpus",
                                                                "kueue.x-k8s.io/pod-group-name": "p-decode-0-r1",
                                                                "pdfleet.dev/role": "decode"}},
                 "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}}
    why = "LocalQueue gpus doesn't exist"
    assert gang_wait.message([pod], 2, {"p-decode-0-r1": why}) == \
        ("waiting for Kueue to admit its gang of 2 pod(s) in queue gpus (spec.decode.scheduling.gang.queueName; "
         f"Workload p-decode-0-r1): {why}")
    placed = {"metadata": {"name": "p-decode-0-1"}, "spec": {}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes fit"}]}}
    assert gang_wait.message([placed], 2) == "waiting for a node: 0/4 nodes fit"
    assert gang_wait.message([{**placed, "status": {}}], 2) is None


def pulling(reason: str, init: bool = False) -> Body:
    failed = 'failed to pull "ghcr.io/pdfleet/nosuch:1": not found'
    status = {"name": "runtime" if init else "engine", "image": "ghcr.io/pdfleet/nosuch:1",
              "state": {"waiting": {"reason": reason, "message": failed}}}
    key = "initContainerStatuses" if init else "containerStatuses"
    return {"metadata": {"name": "p-decode-0-0"}, "spec": {"nodeName": "n"}, "status": {key: [status]}}


def test_an_image_its_node_cannot_pull_is_named_with_the_kubelet_s_reason() -> None:
    assert gang_wait.message([pulling("ErrImagePull")], 1) == (
        "waiting for an image: container engine of pod p-decode-0-0 (image ghcr.io/pdfleet/nosuch:1): ErrImagePull: "
        'failed to pull "ghcr.io/pdfleet/nosuch:1": not found')
    assert "container runtime of pod" in (gang_wait.message([pulling("ImagePullBackOff", init=True)], 1) or "")
    # Waiting for another reason (the container is being created) is no image problem
    assert gang_wait.message([pulling("ContainerCreating")], 1) is None


def test_an_image_wait_is_one_warning_however_the_kubelet_s_reason_turns() -> None:
    def status(message: str) -> InferencePoolStatus:
        return InferencePoolStatus.model_validate({"groups": [
            {"name": "g", "role": "decode", "revision": "r", "message": message}]})

    first = status(f"Starting; {gang_wait.message([pulling('ErrImagePull')], 1)}")
    said = gang_wait.events(first.groups, status("Starting: 0/1 pod(s) ready"))
    assert [(e.type, e.reason) for e in said] == [("Warning", "ImagePullFailed")]
    assert "ghcr.io/pdfleet/nosuch:1" in said[0].message
    backoff = status(f"Starting; {gang_wait.message([pulling('ImagePullBackOff')], 1)}")
    assert gang_wait.events(backoff.groups, first) == []
    # A group that waited for a node and now waits for an image is told about: the new wait needs a person
    node_wait = status(f"Starting; {gang_wait.FOR_NODE}: 0/4 nodes fit")
    assert [e.reason for e in gang_wait.events(first.groups, node_wait)] == ["ImagePullFailed"]


def test_an_operator_restart_does_not_say_it_again() -> None:
    status = InferencePoolStatus.model_validate({"groups": [
        {"name": "g", "role": "decode", "revision": "r", "message": f"Starting; {gang_wait.FOR_GANG} of 2"}]})
    assert gang_wait.events(status.groups, status) == []


class Workloads:
    """A stand-in for the apiserver's Workload reads: what each GET returns, and how many were made."""

    def __init__(self, bodies: dict[str, Body]) -> None:
        self.bodies = bodies
        self.gets: list[str] = []

    async def request(self, method: str, path: str, **_: Any) -> Body:
        self.gets.append(path)
        name = path.rsplit("/", 1)[-1]
        if name not in self.bodies:
            raise KubeError(404, "NotFound", f'workloads.kueue.x-k8s.io "{name}" not found')
        return self.bodies[name]


def test_kueue_s_reason_is_read_from_the_workload_and_kept_a_while() -> None:
    refused = {"status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Inadmissible",
                                          "message": "LocalQueue nosuch doesn't exist"}]}}
    admitted = {"status": {"conditions": [{"type": "QuotaReserved", "status": "True", "message": "Quota reserved"}]}}
    client = Workloads({"a-r1": refused, "b-r1": admitted})
    reader = WorkloadReasons(client, ttl=3600)  # type: ignore[arg-type]
    got = asyncio.run(reader.read("ns", ["a-r1", "b-r1", "c-r1"]))
    assert got == {"a-r1": "LocalQueue nosuch doesn't exist"}
    assert asyncio.run(reader.read("ns", ["a-r1"])) == got and len(client.gets) == 3, "kept: no second GET"
    assert client.gets[0] == "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/a-r1"


def test_only_the_gangs_kueue_holds_are_read() -> None:
    held = {"metadata": {"name": "x-0", "labels": {"kueue.x-k8s.io/pod-group-name": "x-r1"}},
            "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}}
    running = {"metadata": {"name": "y-0", "labels": {"kueue.x-k8s.io/pod-group-name": "y-r1"}}, "spec": {}}
    going = {**held, "metadata": {**held["metadata"], "deletionTimestamp": "2026-12-05T00:00:00Z"}}
    assert gang_wait.held_gangs([held, running, going]) == {"x-r1"}


def test_deleted_pods_that_hold_nothing_lose_kueue_s_finalizer_and_no_other_pod_does() -> None:
    def pod(name: str, *, deleting: bool = True, gated_: bool = True, node: str | None = None,
            phase: str = "Pending") -> Body:
        return {"metadata": {"name": name, "namespace": "ns", "finalizers": ["kueue.x-k8s.io/managed"],
                             **({"deletionTimestamp": "2026-12-05T00:00:00Z"} if deleting else {})},
                "spec": {**({"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]} if gated_ else {}),
                         **({"nodeName": node} if node else {})},
                "status": {"phase": phase}}

    stranded = pod("a")  # never admitted
    ended = [pod("done", gated_=False, node="n1", phase="Succeeded"), pod("crashed", gated_=False, node="n1",
                                                                           phase="Failed")]
    others = [pod("live", deleting=False), pod("admitted", gated_=False), pod("bound", node="n1"),
              pod("running", gated_=False, node="n1", phase="Running"),
              pod("ended, not deleted", deleting=False, gated_=False, node="n1", phase="Succeeded")]
    assert gang_wait.stranded([stranded, *ended, *others]) == [stranded, *ended]
    # Heard of as deleted with the body last seen before its namespace went (kopf_fixes): not yet marked deleted
    # there, held all the same. Running or admitted pods are Kueue's to release.
    assert [p["metadata"]["name"] for p in (stranded, *ended, *others)
            if gang_wait.stranded_with_its_namespace(p)] == ["a", "done", "crashed", "live", "ended, not deleted"]
    assert not gang_wait.stranded_with_its_namespace({**stranded, "metadata": {"name": "a", "finalizers": []}})

    patches: list[tuple[str, Any]] = []

    class Client:
        async def request(self, method: str, path: str, **kw: Any) -> Body:
            patches.append((f"{method} {path}", kw["body"]))
            return {}

    asyncio.run(WorkloadReasons(Client()).release([stranded], "kueue.x-k8s.io/managed"))  # type: ignore[arg-type]
    assert patches == [("PATCH /api/v1/namespaces/ns/pods/a", [
        {"op": "test", "path": "/metadata/finalizers", "value": ["kueue.x-k8s.io/managed"]},
        {"op": "replace", "path": "/metadata/finalizers", "value": []}])]
