"""The executor against an in-memory apiserver (`tests.support.fake_kube`): what it writes, in what order, how
often, and what it does when the API says no. The planner's decisions are `test_planning`'s business; here a
change to how plans turn into API calls fails fast, without a cluster."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from pdfleet.operator import metrics
from pdfleet.operator.controller import Controller
from pdfleet.operator.planning import reconcile
from pdfleet.operator.workqueue import Retry
from tests.support.fake_kube import FakeKube, Write
from tests.support.pools import pool_body

KEY = ("ns", "tiny")
Body = dict[str, Any]
ROUTER_OBJECTS = [("ServiceAccount", "tiny-router"), ("Role", "tiny-router"), ("RoleBinding", "tiny-router"),
                  ("Deployment", "tiny-router"), ("Service", "tiny-router"), ("Secret", "tiny-router-key"),
                  ("NetworkPolicy", "tiny-engines"), ("NetworkPolicy", "tiny-router"),
                  ("PodDisruptionBudget", "tiny-router")]
GROUP_OBJECTS = [("Service", "tiny-prefill"), ("Pod", "tiny-prefill-0-0"),
                 ("Service", "tiny-decode"), ("Pod", "tiny-decode-0-0")]
SECRET = ("Secret", "tiny-router-key")


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    kube.seed(pool_body())
    return kube


def executor(kube: FakeKube) -> Controller:
    return Controller(client=kube, cache=kube.cache())


def what(writes: list[Write], verb: str | None = None) -> list[tuple[str, str]]:
    return [(w.kind, w.name) for w in writes if verb is None or w.verb == verb]


def objects_written(writes: list[Write]) -> list[tuple[str, str]]:
    """The pool's objects written: applied, or created (engine pods)."""
    return [(w.kind, w.name) for w in writes if w.verb == "apply" or (w.verb == "create" and w.kind != "Event")]


def pool(kube: FakeKube) -> Body:
    body = kube.get("InferencePool", *KEY)
    assert body is not None
    return body


def kubelet_runs_everything(kube: FakeKube) -> None:
    """What kubelet and the Deployment controller would do next: every pod Running and Ready with an IP, the
    router available."""
    for n, p in enumerate(kube.of_kind("Pod", "ns")):
        kube.run_pod("ns", p["metadata"]["name"], ip=f"127.1.0.{n + 2}")
    for d in kube.of_kind("Deployment", "ns"):
        kube.update("Deployment", "ns", d["metadata"]["name"], lambda o: o.update(
            status={"replicas": o["spec"]["replicas"], "availableReplicas": o["spec"]["replicas"]}))


async def settle(kube: FakeKube, controller: Controller, limit: int = 5) -> None:
    """Reconciles until a reconcile writes nothing (the watch is instant here)."""
    for _ in range(limit):
        await controller.reconcile(KEY)
        if not kube.take_writes():
            return
    raise AssertionError(f"still writing after {limit} reconciles")


async def test_a_new_pool_gets_exactly_the_planned_objects_then_one_status_then_its_events(kube: FakeKube) -> None:
    planned = reconcile.plan(pool(kube), kube.cache().snapshot(KEY), now=datetime.datetime.now(datetime.UTC))
    rv = pool(kube)["metadata"]["resourceVersion"]

    await executor(kube).reconcile(KEY)

    writes = kube.take_writes()
    assert all(w.ok for w in writes), writes
    # The router-key Secret is the executor's (its values are not the planner's to make), written alongside the
    # planned objects. Engine pods are created (never changed in place), the rest applied.
    assert sorted(objects_written(writes)) == sorted([SECRET, *((o["kind"], o["metadata"]["name"])
                                                                for o in planned.apply)])
    assert sorted(objects_written(writes)) == sorted(ROUTER_OBJECTS + GROUP_OBJECTS)
    assert sorted(what(writes, "create")[:2]) == [("Pod", "tiny-decode-0-0"), ("Pod", "tiny-prefill-0-0")]
    # Objects, then status, then events; a RoleBinding only after the Role it binds, the router's Deployment only
    # after its ServiceAccount, RoleBinding and the Secret it takes its key from; engine pods and Services wait for
    # nothing, not even the Secret.
    verbs = [w.verb for w in writes]
    assert sorted(verbs[:13]) == ["apply"] * 11 + ["create"] * 2
    assert verbs[13:] == ["status"] + ["create"] * len(planned.events)
    order = objects_written(writes)
    sent = {(w.kind, w.name): w for w in writes}
    binding = sent[("RoleBinding", "tiny-router")]
    assert binding.started > max(sent[("Role", "tiny-router")].answered,
                                 sent[("ServiceAccount", "tiny-router")].answered)
    router = sent[("Deployment", "tiny-router")]
    assert router.started > max(binding.answered, sent[("ServiceAccount", "tiny-router")].answered,
                                sent[SECRET].answered)
    assert max(sent[k].started for k in GROUP_OBJECTS) < binding.started, "a new pool's pods go out first"
    # The status patch is guarded by the resourceVersion the plan was made from, and is stored.
    status_write = next(w for w in writes if w.verb == "status")
    assert status_write.body is not None and status_write.body["metadata"] == {"resourceVersion": rv}
    assert pool(kube)["status"]["phase"] == "Pending"
    # Every object is the pool's (the garbage collector removes them with it).
    uid = pool(kube)["metadata"]["uid"]
    for kind, name in order:
        refs = kube.get(kind, "ns", name)["metadata"]["ownerReferences"]  # type: ignore[index]
        assert [r["uid"] for r in refs if r.get("controller")] == [uid]
    events = kube.of_kind("Event", "ns")
    assert sorted(e["reason"] for e in events) == sorted(e.reason for e in planned.events) == \
        ["GroupCreated", "GroupCreated"]
    assert {(e["involvedObject"]["kind"], e["involvedObject"]["uid"], e["type"]) for e in events} == \
        {("InferencePool", uid, "Normal")}


async def test_at_steady_state_a_reconcile_writes_nothing(kube: FakeKube) -> None:
    controller = executor(kube)
    await settle(kube, controller)  # the pods exist; Progressing

    kubelet_runs_everything(kube)
    await controller.reconcile(KEY)
    writes = kube.take_writes()
    assert what(writes, "status") == [("InferencePool", "tiny")]
    assert what(writes, "apply") == [] and what(writes, "delete") == []
    assert pool(kube)["status"]["phase"] == "Ready"

    for _ in range(3):
        await controller.reconcile(KEY)
        assert kube.take_writes() == []
    # A new executor (an operator restart) starts from the cluster, and agrees.
    await executor(kube).reconcile(KEY)
    assert kube.take_writes() == []


async def test_what_the_status_no_longer_says_is_removed_from_it_and_then_nothing_is_written(kube: FakeKube) -> None:
    """The wire form leaves out what is unset, and a merge patch keeps what it does not name: a field the plan no
    longer sets must be written as null, or it stays in the stored status and every reconcile writes again."""
    controller = executor(kube)
    await settle(kube, controller)
    kubelet_runs_everything(kube)
    await settle(kube, controller)
    stale = {"decode": {**pool(kube)["status"]["decode"], "surgeUnschedulable": "0123456789"},
             "routers": [{"name": "tiny-router-gone", "availablePrefill": 0, "availableDecode": 1}]}
    kube.update("InferencePool", *KEY, lambda o: o["status"].update(stale))
    await controller.reconcile(KEY)
    [write] = [w for w in kube.take_writes() if w.verb == "status"]
    assert write.body is not None and write.body["status"]["routers"] is None
    assert write.body["status"]["decode"]["surgeUnschedulable"] is None
    status = pool(kube)["status"]
    assert "routers" not in status and "surgeUnschedulable" not in status["decode"], status
    assert status["phase"] == "Ready"
    for _ in range(2):
        await controller.reconcile(KEY)
        assert kube.take_writes() == []


async def test_a_spec_change_patches_only_the_objects_it_changes(kube: FakeKube) -> None:
    controller = executor(kube)
    await settle(kube, controller)
    kubelet_runs_everything(kube)
    await settle(kube, controller)
    before = {k: kube.get(*k[:1], "ns", k[1]) for k in ROUTER_OBJECTS + GROUP_OBJECTS}

    kube.update("InferencePool", *KEY, lambda p: p["spec"].setdefault("router", {}).update(replicas=3))
    await controller.reconcile(KEY)

    writes = kube.take_writes()
    assert what(writes, "apply") == [("Deployment", "tiny-router")]
    assert what(writes, "delete") == []
    assert kube.get("Deployment", "ns", "tiny-router")["spec"]["replicas"] == 3  # type: ignore[index]
    assert pool(kube)["status"]["observedGeneration"] == 2
    unchanged = [k for k in before if k != ("Deployment", "tiny-router")]
    assert all(kube.get(k[0], "ns", k[1]) == before[k] for k in unchanged)


async def test_scaling_up_creates_only_the_new_groups_objects(kube: FakeKube) -> None:
    controller = executor(kube)
    await settle(kube, controller)

    kube.update("InferencePool", *KEY, lambda p: p["spec"]["decode"].update(replicas=2))
    await controller.reconcile(KEY)

    writes = kube.take_writes()
    assert objects_written(writes) == [("Pod", "tiny-decode-1-0")], "the role's Service already names it"
    assert what(writes, "apply") == [], "a pod is created, not applied"
    assert [e for e in what(writes, "create")] and \
        [kind for kind, _ in what(writes, "create")] == ["Pod"] + ["Event"] * (len(what(writes, "create")) - 1)


@pytest.mark.parametrize("status", [409, 500, 503])
async def test_a_failed_write_retries_and_the_retry_writes_only_what_is_missing(kube: FakeKube,
                                                                              status: int) -> None:
    controller = executor(kube)
    kube.fail("create", kind="Pod", name="tiny-decode-0-0", status=status)

    with pytest.raises(Retry):
        await controller.reconcile(KEY)

    writes = kube.take_writes()
    assert [(w.kind, w.name, w.code) for w in writes if not w.ok] == [("Pod", "tiny-decode-0-0", status)]
    assert kube.get("Pod", "ns", "tiny-decode-0-0") is None
    assert kube.get("Pod", "ns", "tiny-prefill-0-0") is not None
    assert what(writes, "status") == []  # status is written only when every object went out
    # The event about the group that failed is not posted (it would not be true); the other one is.
    events = kube.of_kind("Event", "ns")
    assert [e["reason"] for e in events] == ["GroupCreated"] and "tiny-prefill-0" in events[0]["message"]

    await controller.reconcile(KEY)

    writes = kube.take_writes()
    assert objects_written(writes) == [("Pod", "tiny-decode-0-0")]
    assert what(writes, "status") == [("InferencePool", "tiny")]
    assert [e["reason"] for e in kube.of_kind("Event", "ns") if "tiny-decode-0" in e["message"]] == ["GroupCreated"]


async def test_a_status_computed_from_a_stale_pool_is_refused_and_recomputed(kube: FakeKube) -> None:
    controller = executor(kube)
    await settle(kube, controller)

    with kube.watch_paused("InferencePool"):  # the user edits the pool; the operator has not seen it yet
        kube.update("InferencePool", *KEY, lambda p: p["metadata"].setdefault("labels", {}).update(team="a"))
        kubelet_runs_everything(kube)  # the pods' watch is current: a new status, planned from the old pool
        with pytest.raises(Retry):
            await controller.reconcile(KEY)
        assert [(w.verb, w.code) for w in kube.take_writes()] == [("status", 409)]
        assert pool(kube)["status"]["phase"] == "Progressing"

    await controller.reconcile(KEY)
    writes = kube.take_writes()
    assert [(w.verb, w.code) for w in writes if w.verb == "status"] == [("status", 200)]
    assert pool(kube)["status"]["phase"] == "Ready"


async def test_a_reconcile_before_the_watch_catches_up_does_not_write_the_same_objects_again(
        kube: FakeKube) -> None:
    controller = executor(kube)
    with kube.watch_paused():
        await controller.reconcile(KEY)
        assert len(objects_written(kube.take_writes())) == 13
        # The pool's own status write is not shown yet either: the reconcile plans from what that write
        # returned, so its guarded status patch goes through (the pods it wrote now count as Starting) instead of
        # being refused with a 409 and retried after a backoff, as it was dozens of times in a burst.
        await controller.reconcile(KEY)
        assert [(w.verb, w.code) for w in kube.take_writes()] == [("status", 200)]
        assert pool(kube)["status"]["phase"] == "Progressing"
    await settle(kube, controller)
    assert len(kube.of_kind("Pod", "ns")) == 2


async def test_deleting_what_is_already_gone_is_done(kube: FakeKube) -> None:
    kube.update("InferencePool", *KEY, lambda p: p["spec"]["decode"].update(replicas=2))
    controller = executor(kube)
    await settle(kube, controller)
    kubelet_runs_everything(kube)
    await settle(kube, controller)

    kube.update("InferencePool", *KEY, lambda p: p["spec"]["decode"].update(replicas=1))
    with kube.watch_paused():  # the pod went away a moment ago; the watch has not said so
        kube.remove("Pod", "ns", "tiny-decode-1-0")
        await controller.reconcile(KEY)  # no Retry: a 404 on delete is success

    writes = kube.take_writes()
    assert sorted((w.kind, w.name, w.code) for w in writes if w.verb == "delete") == [("Pod", "tiny-decode-1-0", 404)]
    await settle(kube, controller)  # and nothing is deleted again once the watch shows them gone


async def test_a_scale_down_deletes_with_the_uid_precondition_and_waits_for_terminating_pods(
        kube: FakeKube) -> None:
    kube.update("InferencePool", *KEY, lambda p: p["spec"]["decode"].update(replicas=2))
    controller = executor(kube)
    await settle(kube, controller)
    uid = kube.get("Pod", "ns", "tiny-decode-1-0")["metadata"]["uid"]  # type: ignore[index]

    kube.update("InferencePool", *KEY, lambda p: p["spec"]["decode"].update(replicas=1))
    await controller.reconcile(KEY)

    deletes = [w for w in kube.take_writes() if w.verb == "delete"]
    assert sorted((w.kind, w.name) for w in deletes) == [("Pod", "tiny-decode-1-0")]
    pod_delete = next(w for w in deletes if w.kind == "Pod")
    assert pod_delete.body is not None and pod_delete.body["preconditions"] == {"uid": uid}
    assert kube.get("Pod", "ns", "tiny-decode-1-0")["metadata"]["deletionTimestamp"]  # type: ignore[index]
    await controller.reconcile(KEY)
    assert what(kube.take_writes(), "delete") == []  # a terminating pod is not deleted again
    assert kube.finish_terminating() == ["tiny-decode-1-0"]
    await settle(kube, controller)


def reasons(kube: FakeKube) -> list[str]:
    return sorted(e["reason"] for e in kube.of_kind("Event", "ns"))


async def test_a_status_write_refused_after_a_scale_down_still_says_the_deletion_once_and_the_scale_once(
        kube: FakeKube) -> None:
    """The group's deletion is made and will not be made again: its Event is posted although the status write
    after it fails. 'Scaled' says what the status says: it waits for the retry (before: GroupDeleted lost)."""
    kube.update("InferencePool", *KEY, lambda p: p["spec"]["decode"].update(replicas=2))
    controller = executor(kube)
    await settle(kube, controller)
    before = reasons(kube)
    kube.update("InferencePool", *KEY, lambda p: p["spec"]["decode"].update(replicas=1))
    kube.fail("status", status=409)

    with pytest.raises(Retry):
        await controller.reconcile(KEY)
    assert what(kube.take_writes(), "delete") == [("Pod", "tiny-decode-1-0")]
    assert reasons(kube) == sorted([*before, "GroupDeleted"])

    await settle(kube, controller)
    assert reasons(kube) == sorted([*before, "GroupDeleted", "Scaled"])


async def test_a_failed_write_holds_back_the_events_the_status_says_and_the_retry_says_them_once(
        kube: FakeKube) -> None:
    """A scale-up whose new pod is refused for now: 'Scaled' is not posted with the failure (the retry plans it
    again from the same previous status: before, it was posted twice)."""
    controller = executor(kube)
    await settle(kube, controller)
    before = reasons(kube)
    kube.update("InferencePool", *KEY, lambda p: p["spec"]["decode"].update(replicas=2))
    kube.fail("create", kind="Pod", name="tiny-decode-1-0", status=500)

    with pytest.raises(Retry):
        await controller.reconcile(KEY)
    assert reasons(kube) == before

    await settle(kube, controller)
    assert reasons(kube) == sorted([*before, "GroupCreated", "Scaled"])


async def test_a_deletion_left_undone_behind_a_failed_write_is_not_said(kube: FakeKube) -> None:
    """The scale-down's deletion waits for the objects' writes; one of them fails, so the deletion is not made,
    and its Event must not say it was (before: posted, as nothing about it had failed)."""
    kube.update("InferencePool", *KEY, lambda p: p["spec"]["decode"].update(replicas=2))
    controller = executor(kube)
    await settle(kube, controller)
    before = reasons(kube)
    kube.update("InferencePool", *KEY, lambda p: (p["spec"]["decode"].update(replicas=1),
                                                   p["spec"].update(router={"replicas": 3})))
    kube.fail("apply", kind="Deployment", name="tiny-router", status=500)

    with pytest.raises(Retry):
        await controller.reconcile(KEY)
    assert what(kube.take_writes(), "delete") == []
    assert reasons(kube) == before

    await settle(kube, controller)
    assert reasons(kube) == sorted([*before, "GroupDeleted", "Scaled"])


async def test_a_lost_event_does_not_fail_the_reconcile(kube: FakeKube) -> None:
    kube.fail("create", kind="Event", status=500, times=2)

    await executor(kube).reconcile(KEY)

    writes = kube.take_writes()
    assert [(w.verb, w.code) for w in writes if w.verb == "create" and w.kind == "Event"] == \
        [("create", 500), ("create", 500)]
    assert what(writes, "status") == [("InferencePool", "tiny")]
    assert len(objects_written(writes)) == 13


def pools_by_phase() -> dict[str, float]:
    return {s.labels["phase"]: s.value for m in metrics.POOLS.collect() for s in m.samples if s.value}


@pytest.mark.parametrize("how", ["gone", "terminating"])
async def test_a_deleted_pool_is_forgotten_and_nothing_is_written(kube: FakeKube, how: str) -> None:
    controller = executor(kube)
    await settle(kube, controller)
    assert pools_by_phase() == {"Progressing": 1}

    if how == "gone":
        kube.remove("InferencePool", *KEY)
        assert kube.of_kind("Pod") == []  # the garbage collector took what it owned
    else:
        kube.update("InferencePool", *KEY, lambda p: p["metadata"].update(deletionTimestamp="2026-11-30T12:01:00Z"))
    await controller.reconcile(KEY)

    assert kube.take_writes() == []
    assert pools_by_phase() == {}

    # A pool of the same name made afterwards is a new pool: everything is created again.
    kube.remove("InferencePool", *KEY) if how == "terminating" else None
    kube.seed(pool_body(uid="uid-2"))
    await controller.reconcile(KEY)
    assert sorted(objects_written(kube.take_writes())) == sorted(ROUTER_OBJECTS + GROUP_OBJECTS)


@pytest.mark.parametrize("when", ["planning", "writing"])
async def test_a_pool_forgotten_while_its_reconcile_runs_is_not_written_nor_counted_again(
        kube: FakeKube, when: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its DELETED event (or its namespace going, operator/kopf_fixes.py) comes while a reconcile of it awaits the
    API: that reconcile raised KeyError when it went on to its writes, and could count the pool again after."""
    controller = executor(kube)
    await settle(kube, controller)
    kube.update("InferencePool", *KEY, lambda p: p["spec"]["decode"].update(replicas=2))
    if when == "planning":
        prepare = controller.router_keys.prepare

        async def forgotten_meanwhile(*args: Any, **kwargs: Any) -> Any:
            controller.forget(KEY)
            return await prepare(*args, **kwargs)
        monkeypatch.setattr(controller.router_keys, "prepare", forgotten_meanwhile)
    else:
        write_status = controller._write_status

        async def forgotten_meanwhile(*args: Any, **kwargs: Any) -> None:
            await write_status(*args, **kwargs)
            controller.forget(KEY)
        monkeypatch.setattr(controller, "_write_status", forgotten_meanwhile)

    await controller.reconcile(KEY)

    if when == "planning":
        assert kube.take_writes() == []
    assert pools_by_phase() == {}


def restarts_counted(reason: str) -> float:
    return sum(s.value for m in metrics.GROUP_RESTARTS.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels["reason"] == reason)


async def test_a_group_whose_pod_ended_is_counted_once_restarted_and_planned_again_when_its_backoff_ends(
        kube: FakeKube) -> None:
    requeued: list[tuple[tuple[str, str], float]] = []
    controller = Controller(client=kube, cache=kube.cache(), requeue=lambda key, delay: requeued.append((key, delay)))
    await settle(kube, controller)
    kubelet_runs_everything(kube)
    await settle(kube, controller)

    def end_decode_pod() -> None:
        kube.update("Pod", "ns", "tiny-decode-0-0", lambda o: o.update(status={"phase": "Failed", "containerStatuses": [
            {"name": "engine", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}))

    before = restarts_counted("PodEnded")
    end_decode_pod()
    await controller.reconcile(KEY)  # the first restart is not delayed
    assert what(kube.take_writes(), "delete") == [("Pod", "tiny-decode-0-0")]
    assert restarts_counted("PodEnded") == before + 1 and requeued == []
    kube.finish_terminating()
    await settle(kube, controller)
    kubelet_runs_everything(kube)

    end_decode_pod()  # again, at once: the group waits out backoff.initial (10 s) and is planned again then
    await controller.reconcile(KEY)
    assert what(kube.take_writes(), "delete") == []
    [(key, delay)] = requeued
    assert key == KEY and 8 <= delay <= 10, delay
    assert restarts_counted("PodEnded") == before + 1


async def test_the_pools_echo_of_its_own_status_write_is_told_from_news(kube: FakeKube) -> None:
    """`wrote` tells the pool's watch handler that an event is the echo of this process's own status write (to be
    coalesced with the events of the objects the same reconcile wrote), and anything else is news."""
    controller = executor(kube)
    before = pool(kube)["metadata"]["resourceVersion"]
    assert not controller.wrote(KEY, before)
    await controller.reconcile(KEY)
    after = pool(kube)["metadata"]["resourceVersion"]
    assert after != before
    assert controller.wrote(KEY, after)
    assert not controller.wrote(KEY, before) and not controller.wrote(KEY, None)
    kube.update("InferencePool", *KEY, lambda o: o["metadata"].setdefault("labels", {}).update(team="a"))
    assert not controller.wrote(KEY, pool(kube)["metadata"]["resourceVersion"]), "someone else's write is news"
    controller.forget(KEY)
    assert not controller.wrote(KEY, after)


async def test_a_new_pools_pods_do_not_wait_for_its_router_key_but_its_router_does(kube: FakeKube) -> None:
    """The Secret's write goes out with the engine objects: when it fails, they are written anyway, the router's
    Deployment (whose pods take their key from it) is not, and the retry writes the Secret, then the Deployment."""
    kube.fail("apply", kind="Secret", status=500, times=1)
    controller = executor(kube)
    with pytest.raises(Retry):
        await controller.reconcile(KEY)
    writes = kube.take_writes()
    assert set(GROUP_OBJECTS) <= set(objects_written(writes))
    assert ("Deployment", "tiny-router") not in objects_written(writes)
    assert what(writes, "status") == [], "nothing is said of a reconcile that failed"

    await controller.reconcile(KEY)
    sent = {(w.kind, w.name): w for w in kube.take_writes()}
    assert sent[SECRET].ok and sent[("Deployment", "tiny-router")].started > sent[SECRET].answered

    # An operator that stopped after making the Secret, before the pool's first status: the next one reads the
    # Secret and keeps its key, which router pods may already hold.
    kept = kube.get("Secret", "ns", "tiny-router-key")
    assert kept is not None
    kube.update("InferencePool", *KEY, lambda p: p.pop("status", None))
    await executor(kube).reconcile(KEY)
    assert kube.get("Secret", "ns", "tiny-router-key")["data"] == kept["data"]  # type: ignore[index]


async def test_a_new_pools_secret_is_read_with_its_first_objects_and_a_key_found_there_is_kept(
        kube: FakeKube) -> None:
    """A pool with no status has its Secret read inside the Secret's write, not before its pods. A Secret an earlier
    operator left whose current key has another name than a new pool's first stops the router Deployment (it
    would name the wrong key) and the retry renders it with the Secret's key."""
    controller = executor(kube)
    await settle(kube, controller)
    kube.update("InferencePool", *KEY, lambda p: p["metadata"].setdefault("annotations", {}).update(
        {"pdfleet.dev/rotate-router-key": "2026-12-03T03:00:00Z"}))
    await settle(kube, controller)
    rotated = kube.get("Secret", "ns", "tiny-router-key")
    assert rotated is not None and "key-2" in rotated["data"]

    kube.remove("Deployment", "ns", "tiny-router")
    kube.update("InferencePool", *KEY, lambda p: p.pop("status", None))
    fresh = executor(kube)
    with pytest.raises(Retry):
        await fresh.reconcile(KEY)
    writes = kube.take_writes()
    assert ("Deployment", "tiny-router") not in objects_written(writes)
    assert [w.verb for w in writes if w.kind == "Secret"] == [], "the Secret found is kept as it is"
    await fresh.reconcile(KEY)
    deployment = kube.get("Deployment", "ns", "tiny-router")
    assert deployment is not None and "key-2" in str(deployment["spec"]["template"])
    assert kube.get("Secret", "ns", "tiny-router-key")["data"] == rotated["data"]  # type: ignore[index]
