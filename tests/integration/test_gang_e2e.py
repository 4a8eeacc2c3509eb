"""The operator's multi-node engine groups placed through the real Kueue (issue 26): a pool whose decode groups
are two pods each, gang-scheduled (`scheduling.gang`), on two fake 8-GPU nodes of the test's own with a Kueue
ClusterQueue that has quota for one of the two pods only. Neither pod binds and no GPU is held, the group's
status (with Kueue's reason) and one Event say it waits for its gang; when the queue gets room both are admitted
together, bind on the test's nodes (Kueue's flavor pins them there) and the pool turns Ready, served by the pod
runner like any pool. A rollout then replaces the group in place by a new gang of the same pod names. A pool
whose queue does not exist says so in its status, in Kueue's words. Two groups that each need both nodes: one
is placed whole, the other held whole; a surge rollout with no room for its gang falls back to in place, and
a restart places the group whole again. Kueue v0.17 (hack/kueue.py), the shared operator, the real apiserver
and kube-scheduler (docs/local-fleet.md, "Gang scheduling with Kueue")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.test_kueue_gang import reserved_gpus, workload
from tests.support import fleet
from tests.support import kueue as kq
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.watches import watching

pytestmark = pytest.mark.cluster

POOL = "gang"
GANG_DECODE = {"replicas": 1, "nodesPerGroup": 2, "gpusPerNode": 1, "tp": 2,
               "scheduling": {"gang": {"queueName": "gpus"}}}


def decode_pods(cluster: Cluster, namespace: str, name: str = POOL) -> list[dict[str, Any]]:
    return fleet.engine_pods(cluster, namespace, name, role="decode")


def waiting_message(cluster: Cluster, namespace: str, name: str, group: str, says: str) -> str | None:
    message = fleet.group_status(cluster, namespace, name, group).get("message") or ""
    return message if says in message else None


def test_a_two_pod_group_waits_whole_for_its_queue_then_binds_together_and_serves(
    cluster: Cluster, operator: OperatorProcess, namespace: str, kueue: None
) -> None:
    with kq.gpu_nodes(cluster, namespace, 2) as nodes, kq.queues(cluster, namespace, gpus=1):
        fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode=GANG_DECODE)
        group = f"{POOL}-decode-0"
        message = wait_for("the decode group to say it waits for its gang", lambda: waiting_message(
            cluster, namespace, POOL, group, "waiting for Kueue to admit its gang of 2 pod(s) in queue gpus"),
            timeout=120)
        pods = decode_pods(cluster, namespace)
        assert len(pods) == 2 and all(kq.gated(p) and not p["spec"].get("nodeName") for p in pods), \
            [p["spec"] for p in pods]
        [gang_name] = {p["metadata"]["labels"][kq.GROUP_LABEL] for p in pods}
        assert gang_name.startswith(f"{group}-") and gang_name in message
        # Kueue's reason, read from the gang's Workload (QuotaReserved=False), in the group's status.
        message = wait_for("Kueue's reason in the group's status", lambda: waiting_message(
            cluster, namespace, POOL, group, "quota for nvidia.com/gpu"), timeout=60)
        refused = kq.condition(workload(cluster, namespace, gang_name) or {}, "QuotaReserved") or {}
        assert refused.get("status") == "False" and refused.get("message") in message, (refused, message)
        assert reserved_gpus(cluster, namespace) == 0, "no GPU is held for a gang that does not fit whole"
        assert fleet.pool(cluster, namespace, POOL)["status"]["decode"]["ready"] == 0

        # Room for both: the ClusterQueue's quota raised (a queue change makes Kueue look again).
        patch = {"spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": namespace, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 2}]}]}]}}
        cluster.kubectl("patch", "clusterqueue.kueue.x-k8s.io", namespace, "--type=merge", "-p", json.dumps(patch))
        fleet.wait_ready(cluster, namespace, POOL, timeout=180)
        placed = decode_pods(cluster, namespace)
        assert {p["spec"]["nodeName"] for p in placed} <= set(nodes), "Kueue's flavor keeps them on the test's nodes"
        assert all(fleet.is_ready(p) and not p["spec"].get("schedulingGates") for p in placed)
        assert [p["metadata"]["uid"] for p in placed] == [p["metadata"]["uid"] for p in pods], \
            "the same pods, admitted: the waiting group was never replaced"
        said = fleet.events(cluster, namespace, POOL, "GroupWaiting")
        assert len(said) == 1 and group in said[0]["message"], [e["message"] for e in said]
        assert reserved_gpus(cluster, namespace) == 2

        # A rollout (in place: maxSurge 0) replaces the group by pods of the same names, in a new gang: the old
        # revision's pods go first, their Workload with them, and its quota admits the new one whole.
        fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode=GANG_DECODE,
                         engine={"env": [{"name": "PDFLEET_SIM_IDLE_MS", "value": "31"}]})

        def rolled() -> list[dict[str, Any]] | None:
            now = decode_pods(cluster, namespace)
            names = {p["metadata"]["labels"][kq.GROUP_LABEL] for p in now}
            return now if len(now) == 2 and names != {gang_name} and all(fleet.is_ready(p) for p in now) else None

        new = wait_for("the new revision's gang admitted and Ready", rolled, timeout=180)
        [new_gang] = {p["metadata"]["labels"][kq.GROUP_LABEL] for p in new}
        assert new_gang.startswith(f"{group}-") and sorted(p["metadata"]["name"] for p in new) == \
            sorted(p["metadata"]["name"] for p in pods), "the same pod names, a new gang"
        wait_for("the old revision's Workload gone", lambda: workload(cluster, namespace, gang_name) is None,
                 timeout=60)
        assert kq.condition(workload(cluster, namespace, new_gang) or {}, "Admitted")["status"] == "True"
        fleet.wait_ready(cluster, namespace, POOL, timeout=120)
        cluster.kubectl("delete", "pdpool", POOL, "-n", namespace, "--wait=true", "--timeout=120s")


def test_a_pool_whose_queue_does_not_exist_says_so(cluster: Cluster, operator: OperatorProcess, namespace: str,
                                                   kueue: None) -> None:
    lost = {"scheduling": {"gang": {"queueName": "nosuch"}}}
    fleet.apply_pool(cluster, namespace, "lost", prefill={"replicas": 1, **lost}, decode={"replicas": 1, **lost})
    for role in ("prefill", "decode"):
        # Kueue's own words, from the group's Workload (kube/kueue.py), in the group's status.
        message = wait_for(f"the {role} group to say its queue does not exist", lambda group=f"lost-{role}-0":
                           waiting_message(cluster, namespace, "lost", group, "LocalQueue nosuch doesn't exist"),
                           timeout=120)
        assert f"waiting for Kueue to admit its gang of 1 pod(s) in queue nosuch (spec.{role}.scheduling.gang." \
            "queueName; Workload" in message, message
    assert fleet.phase(cluster, namespace, "lost") != "Ready"
    assert not [p for p in fleet.engine_pods(cluster, namespace, "lost") if p["spec"].get("nodeName")]
    delete_unadmitted(cluster, namespace, "lost")


def test_a_namespace_deleted_with_a_gang_kueue_never_admitted_goes(cluster: Cluster, operator: OperatorProcess,
                                                                    namespace: str, kueue: None) -> None:
    """Deleting the namespace, not the pool: the operator stops watching it (kopf does, at the namespace
    controller's first status write) while its pods still wait at Kueue's gate with Kueue's finalizer, which Kueue
    never takes off a pod it never admitted. Seen: the namespace Terminating for good, a prefill pod kept. The
    operator hears of each pod once more as deleted (operator/kopf_fixes.py) and takes the finalizer off."""
    lost = {"scheduling": {"gang": {"queueName": "nosuch"}}}
    fleet.apply_pool(cluster, namespace, "lost", prefill={"replicas": 1, **lost}, decode={"replicas": 1, **lost})
    wait_for("both groups' pods at Kueue's gate", lambda: len(
        [p for p in fleet.engine_pods(cluster, namespace, "lost") if kq.gated(p)]) == 2, timeout=120)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    wait_for(f"namespace {namespace} gone", timeout=120,
             probe=lambda: cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0)


def delete_unadmitted(cluster: Cluster, namespace: str, name: str) -> None:
    """Deletes pool `name`, whose pods Kueue never admitted, and waits for them to go. Kueue v0.17 keeps its
    finalizer on the deleted, still gated pods of a serving group it never admitted (its Workload is deleted,
    the pods would stay Terminating): the operator takes it off, for a deleted pool's pods too (the garbage
    collector's deletion of each is queued as a reconcile of the pool: planning/scale/gang_wait.stranded)."""
    assert [p for p in fleet.engine_pods(cluster, namespace, name) if kq.gated(p)], "the pool's pods wait for Kueue"
    cluster.kubectl("delete", "pdpool", name, "-n", namespace, "--wait=true", "--timeout=120s")
    wait_for(f"pool {name}'s pods gone", lambda: not fleet.engine_pods(cluster, namespace, name), timeout=60)


def test_a_required_topology_domain_holds_the_whole_group_or_says_why_it_waits(
    cluster: Cluster, operator: OperatorProcess, namespace: str, kueue: None
) -> None:
    """`scheduling.topology: {nodeLabel: kubernetes.io/hostname}` (Required) through a topology-aware flavor (a
    Kueue Topology of one level, the node): a group of two 8-GPU pods fits no single 8-GPU node, so Kueue
    refuses it and the group's status says why. The spec changed to 2 GPUs a pod, the waiting group is
    replaced (its pods, which Kueue never admitted, do go) and the new one lands whole on one node."""
    topology = {"gang": {"queueName": "gpus"}, "topology": {"nodeLabel": "kubernetes.io/hostname"}}
    wide = {**GANG_DECODE, "gpusPerNode": 8, "tp": 16, "scheduling": topology}
    with kq.gpu_nodes(cluster, namespace, 2) as nodes, kq.queues(cluster, namespace, gpus=32, topology=namespace):
        fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode=wide)
        group = f"{POOL}-decode-0"
        message = wait_for("Kueue's topology refusal in the group's status", lambda: waiting_message(
            cluster, namespace, POOL, group, "topology"), timeout=120)
        assert "waiting for Kueue to admit its gang of 2 pod(s) in queue gpus" in message, message
        assert not [p for p in decode_pods(cluster, namespace) if p["spec"].get("nodeName")]
        assert reserved_gpus(cluster, namespace) == 0

        fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1},
                         decode={**wide, "gpusPerNode": 2, "tp": 4})
        fleet.wait_ready(cluster, namespace, POOL, timeout=180)
        placed = decode_pods(cluster, namespace)
        assert len(placed) == 2 and all(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
                                        for p in placed)
        [node] = {p["spec"]["nodeName"] for p in placed}
        assert node in nodes, "one domain (node) holds the whole group"
        cluster.kubectl("delete", "pdpool", POOL, "-n", namespace, "--wait=true", "--timeout=120s")


def by_group(cluster: Cluster, namespace: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in decode_pods(cluster, namespace):
        if not pod["metadata"].get("deletionTimestamp"):
            out.setdefault(pod["metadata"]["labels"]["pdfleet.dev/group"], []).append(pod)
    return out


def placed_whole(pods: list[dict[str, Any]]) -> bool:
    return len(pods) == 2 and all(p["spec"].get("nodeName") and fleet.is_ready(p) for p in pods)


def test_two_groups_competing_for_two_nodes_one_placed_whole_then_a_surge_rollout_and_a_restart(
    cluster: Cluster, operator: OperatorProcess, namespace: str, kueue: None
) -> None:
    """Two decode groups of two 8-GPU pods each on two 8-GPU nodes (quota 16): kube-scheduler alone could bind
    one pod of each, one per node, and neither group would ever run. Kueue admits one whole, the other waits with
    no pod bound. Scaled to one group, the waiting one goes (a group that does not serve goes first). A rollout
    with maxSurge 1 finds no room for its surge gang: Kueue's reason makes it fall back to replacing in place
    (RolloutSurgeUnschedulable): the old gang goes first, then the new one is admitted whole. An engine that
    crashes restarts the group as a unit: its pods go first, then the new gang is admitted whole."""
    big = {**GANG_DECODE, "replicas": 2, "gpusPerNode": 8, "tp": 16}
    surge = {"maxSurge": {"decode": 1}, "maxUnavailable": {"decode": 1}}
    with kq.gpu_nodes(cluster, namespace, 2) as nodes, kq.queues(cluster, namespace, gpus=16):
        fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode=big, rollout=surge)

        def one_placed_one_waiting() -> tuple[str, str] | None:
            groups = by_group(cluster, namespace)
            placed = [g for g, pods in groups.items() if placed_whole(pods)]
            held = [g for g, pods in groups.items() if len(pods) == 2 and all(kq.gated(p) for p in pods)]
            return (placed[0], held[0]) if len(placed) == 1 and len(held) == 1 else None

        winner, loser = wait_for("one group placed whole, the other held whole", one_placed_one_waiting, timeout=180)
        groups = by_group(cluster, namespace)
        assert {p["spec"]["nodeName"] for p in groups[winner]} == set(nodes), "one pod per node"
        assert not [p for p in groups[loser] if p["spec"].get("nodeName")], "nothing of the other group binds"
        wait_for("Kueue's reason in the waiting group's status", lambda: waiting_message(
            cluster, namespace, POOL, loser, "insufficient unused quota for nvidia.com/gpu"), timeout=60)
        assert reserved_gpus(cluster, namespace) == 16

        # One group: the one that does not serve goes (its pods, never admitted, lose Kueue's finalizer).
        fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={**big, "replicas": 1},
                         rollout=surge)
        wait_for("the waiting group gone", lambda: not [p for p in decode_pods(cluster, namespace)
                                                        if p["metadata"]["labels"]["pdfleet.dev/group"] == loser],
                 timeout=120)
        fleet.wait_ready(cluster, namespace, POOL, timeout=120)
        [old] = by_group(cluster, namespace).values()
        [old_gang] = {p["metadata"]["labels"][kq.GROUP_LABEL] for p in old}

        # A rollout with maxSurge 1 and no room for its surge gang falls back to in place, in Kueue's words.
        fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={**big, "replicas": 1},
                         rollout=surge, engine={"env": [{"name": "PDFLEET_SIM_IDLE_MS", "value": "31"}]})
        [fell_back] = wait_for("RolloutSurgeUnschedulable", lambda: fleet.events(
            cluster, namespace, POOL, "RolloutSurgeUnschedulable"), timeout=120)
        assert "is held by Kueue, which has no room for its gang (couldn't assign flavors to pod set" in \
            fell_back["message"] and "insufficient unused quota for nvidia.com/gpu" in fell_back["message"], \
            fell_back["message"]

        def rolled() -> list[dict[str, Any]] | None:  # replaced in place, under its name, as a new gang
            groups = list(by_group(cluster, namespace).values())
            return groups[0] if len(groups) == 1 and placed_whole(groups[0]) and \
                {p["metadata"]["labels"][kq.GROUP_LABEL] for p in groups[0]} != {old_gang} else None

        new = wait_for("the new revision's gang placed whole in place", rolled, timeout=180)
        assert {p["spec"]["nodeName"] for p in new} == set(nodes)
        fleet.wait_ready(cluster, namespace, POOL, timeout=120)
        update = fleet.pool(cluster, namespace, POOL)["status"]["updateRevision"]
        assert fleet.pool(cluster, namespace, POOL)["status"]["decode"]["surgeUnschedulable"] == update

        # A restart (an engine that crashes): the group's pods go and come back, admitted whole again.
        fleet.inject(cluster, namespace, new[0]["metadata"]["name"], "crash")
        uids = {p["metadata"]["uid"] for p in new}

        def restarted() -> list[dict[str, Any]] | None:  # the same group's pods again (the status keeps its name)
            groups = list(by_group(cluster, namespace).values())
            return groups[0] if len(groups) == 1 and placed_whole(groups[0]) and \
                not uids & {p["metadata"]["uid"] for p in groups[0]} else None

        again = wait_for("the restarted group placed whole", restarted, timeout=120)
        assert {p["spec"]["nodeName"] for p in again} == set(nodes)
        assert fleet.events(cluster, namespace, POOL, "GroupRestarted")
        fleet.wait_ready(cluster, namespace, POOL, timeout=120)

        cluster.kubectl("delete", "pdpool", POOL, "-n", namespace, "--wait=true", "--timeout=120s")


GANG_POD_COLUMNS = (r"custom-columns=UID:.metadata.uid,GANG:.metadata.labels.kueue\.x-k8s\.io/pod-group-name,"
                    r"REVISION:.metadata.labels.pdfleet\.dev/revision,"
                    r"NODE:.spec.nodeName,READY:.status.conditions[?(@.type=='Ready')].status,"
                    "DELETED:.metadata.deletionTimestamp")


def test_a_surge_rollout_with_room_places_the_new_gang_whole_before_the_old_one_goes(
    cluster: Cluster, operator: OperatorProcess, namespace: str, kueue: None
) -> None:
    """maxSurge 1, with quota for two gangs of two 1-GPU pods: the new revision's first group is a surge group
    above replicas, a gang of its own that Kueue admits whole beside the old one, and the old group's pods are
    deleted only once both pods of that gang are bound and Ready (then the old group is replaced in place and
    the surge group goes, docs/rollouts.md). Every version of the pods comes from a watch, so an old pod deleted
    while a new one still waited, even briefly, fails the test."""
    surge = {"maxSurge": {"decode": 1}, "maxUnavailable": {"decode": 1}}
    with kq.gpu_nodes(cluster, namespace, 2) as nodes, kq.queues(cluster, namespace, gpus=4):
        fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode=GANG_DECODE, rollout=surge)
        fleet.wait_ready(cluster, namespace, POOL, timeout=180)
        old = decode_pods(cluster, namespace)
        old_uids = {p["metadata"]["uid"] for p in old}
        [old_gang] = {p["metadata"]["labels"][kq.GROUP_LABEL] for p in old}
        labels = f"pdfleet.dev/pool={POOL},pdfleet.dev/role=decode"
        with watching(cluster, "pods", "-n", namespace, "-l", labels, output=GANG_POD_COLUMNS) as pods:
            fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode=GANG_DECODE, rollout=surge,
                             engine={"env": [{"name": "PDFLEET_SIM_IDLE_MS", "value": "31"}]})

            def rolled() -> list[dict[str, Any]] | None:
                now = [p for p in decode_pods(cluster, namespace) if not p["metadata"].get("deletionTimestamp")]
                fresh = not old_uids & {p["metadata"]["uid"] for p in now}
                return now if fresh and placed_whole(now) else None

            new = wait_for("the old group replaced by the new revision's gang", rolled, timeout=240)
            wait_for("the old pods gone", lambda: not old_uids & {
                p["metadata"]["uid"] for p in decode_pods(cluster, namespace)}, timeout=120)
        [new_gang] = {p["metadata"]["labels"][kq.GROUP_LABEL] for p in new}
        assert new_gang != old_gang and {p["spec"]["nodeName"] for p in new} <= set(nodes)

        # Every version the watch saw, in order: the first old pod's deletion, and what the new pods were then.
        [update] = {p["metadata"]["labels"]["pdfleet.dev/revision"] for p in new}  # the role's new revision
        latest: dict[str, list[str]] = {}
        first_deletion = None
        for version in pods.seen:
            uid, gang_, revision, node, ready, deleted = version.line.split()
            latest[uid] = [gang_, revision, node, ready]
            if uid in old_uids and deleted != "<none>":
                first_deletion = {u: v for u, v in latest.items() if u not in old_uids}
                break
        story = "\n".join(v.line for v in pods.seen)
        assert first_deletion is not None, f"the watch saw no old pod deleted:\n{story}"
        assert len(first_deletion) == 2 and len({g for g, *_ in first_deletion.values()}) == 1, \
            f"one gang of two new pods exists before an old pod goes:\n{story}"
        assert all(r == update and n != "<none>" and ok == "True" for _, r, n, ok in first_deletion.values()), \
            f"both pods of the new revision's gang bound and Ready before an old pod is deleted:\n{story}"
        [surge_gang] = {g for g, *_ in first_deletion.values()}
        assert surge_gang.startswith(f"{POOL}-decode-1-"), f"the surge group, above replicas: {surge_gang}"
        assert not fleet.events(cluster, namespace, POOL, "RolloutSurgeUnschedulable")
        wait_for("RolloutCompleted", lambda: fleet.events(cluster, namespace, POOL, "RolloutCompleted"), timeout=120)
        fleet.wait_ready(cluster, namespace, POOL, timeout=120)
        cluster.kubectl("delete", "pdpool", POOL, "-n", namespace, "--wait=true", "--timeout=120s")
