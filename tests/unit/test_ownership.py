"""Touch only what it owns (issue 40): an object with a name the pool would write that the pool does not control
is left alone, not patched, adopted or deleted, and the pool says which object blocks it, once, and goes on by
itself once it is gone. The pure decision over every kind a pool writes first, then the executor against the
in-memory apiserver."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from pdfleet.operator.cache import Observed
from pdfleet.operator.controller import Controller
from pdfleet.operator.kube.router_key_secrets import RouterKeys
from pdfleet.operator.planning import ownership, reconcile
from pdfleet.operator.render import router_secret
from tests.support.fake_kube import FakeKube
from tests.support.pools import pool_body

KEY = ("ns", "tiny")
UID = "uid-1"
NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)
Body = dict[str, Any]


def desired() -> list[Body]:
    """Everything a new pool of the minimal example writes: its planned objects, its router-key Secret, and an
    evidence ConfigMap as a capture would write it."""
    planned = reconcile.plan(pool_body(uid=UID), Observed(pool=None, owned={}), now=NOW)
    return [*planned.apply, router_secret.reference("tiny"),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tiny-decode-0-evidence-1"}}]


def kinds() -> list[str]:
    return sorted({o["kind"] for o in desired()})


def test_the_decision_covers_every_kind_the_operator_writes() -> None:
    assert kinds() == ["ConfigMap", "Deployment", "NetworkPolicy", "Pod", "PodDisruptionBudget", "Role",
                       "RoleBinding", "Secret", "Service", "ServiceAccount"]


def foreign(obj: Body, owner: Body | None = None) -> Body:
    """What someone else made under the object's name."""
    meta: Body = {"name": obj["metadata"]["name"], "namespace": "ns", "uid": "theirs"}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": meta}


def pool_ref(uid: str, *, controller: bool = True) -> Body:
    return {"apiVersion": "pdfleet.dev/v1alpha1", "kind": "InferencePool", "name": "tiny", "uid": uid,
            "controller": controller}


@pytest.mark.parametrize("kind", kinds())
def test_an_object_of_any_kind_the_pool_does_not_control_blocks_it(kind: str) -> None:
    want = desired()
    taken = next(o for o in want if o["kind"] == kind)
    for owner, held in [(None, "no controller"),
                        ({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "r1",
                          "controller": True}, "controlled by ReplicaSet web-1 (uid r1)"),
                        # An earlier pool of the same name, whose objects the garbage collector has yet to remove.
                        (pool_ref("uid-0"), "controlled by InferencePool tiny (uid uid-0)"),
                        # The pool's reference without controller: true is not control either.
                        (pool_ref(UID, controller=False), "no controller")]:
        found = {ownership.key_of(taken): foreign(taken, owner)}
        blocked = ownership.blockers(UID, "ns", want, found)
        name = taken["metadata"]["name"]
        assert blocked == (ownership.Blocker(kind, "ns", name, held.removeprefix("controlled by ")
                                             if owner and owner.get("controller") else ""),)
        assert str(blocked[0]) == f"{kind} ns/{name} ({held})"


def test_what_the_pool_controls_or_nothing_has_blocks_nothing() -> None:
    want = desired()
    ours = {ownership.key_of(o): foreign(o, pool_ref(UID)) for o in want}
    assert ownership.blockers(UID, "ns", want, ours) == ()
    assert ownership.blockers(UID, "ns", want, {ownership.key_of(o): None for o in want}) == ()
    assert ownership.blockers(UID, "ns", want, {}) == ()
    assert not ownership.controlled_by(foreign(want[0], pool_ref("")), "")  # a pool without a uid controls nothing


def test_only_what_nothing_vouches_for_is_read() -> None:
    want = desired()
    owned = {("Deployment", "tiny-router"): {}}
    written = [("Pod", "tiny-decode-0-0")]
    read = {ownership.key_of(o) for o in ownership.unverified(want, owned, written)}
    assert read == {ownership.key_of(o) for o in want} - {("Deployment", "tiny-router"), ("Pod", "tiny-decode-0-0")}


def accepted(status: Body) -> Body:
    return next(c for c in status["conditions"] if c["type"] == "Accepted")


def test_the_pool_says_which_objects_block_it_and_what_to_do_once() -> None:
    pool = pool_body(uid=UID)
    role = ownership.Blocker("Role", "ns", "tiny-router")
    secret = ownership.Blocker("Secret", "ns", "tiny-router-key", "ReplicaSet x (uid y)")
    status, events = ownership.blocked_status(pool, None, (role, secret), NOW)
    assert status is not None and status["phase"] == "Degraded"
    cond = accepted(status)
    assert (cond["status"], cond["reason"]) == ("False", "ObjectNotOwned")
    assert "Role ns/tiny-router (no controller), Secret ns/tiny-router-key (controlled by ReplicaSet x" \
        in cond["message"]
    assert "delete or rename each, or create the pool under another name" in cond["message"]
    assert [(e.type, e.reason, e.message) for e in events] == [("Warning", "ObjectNotOwned", cond["message"])]

    pool["status"] = status  # written: looked at again, the same objects change nothing and say nothing
    assert ownership.blocked_status(pool, None, (role, secret), NOW + datetime.timedelta(minutes=1)) == (None, ())
    status, events = ownership.blocked_status(pool, None, (role,), NOW + datetime.timedelta(minutes=1))
    assert status is not None and len(events) == 1 and "Secret" not in events[0].message
    assert accepted(status)["lastTransitionTime"] == cond["lastTransitionTime"]  # still False: no transition


def test_a_long_list_is_counted() -> None:
    many = tuple(ownership.Blocker("Pod", "ns", f"tiny-decode-{i:02d}-0") for i in range(13))
    text = ownership.message(many)
    assert text.startswith("13 object(s)") and "tiny-decode-09-0" in text and "tiny-decode-10-0" not in text
    assert " and 3 more." in text


# --- the executor -------------------------------------------------------------------------------------------


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    kube.seed(pool_body())
    return kube


def pool(kube: FakeKube) -> Body:
    body = kube.get("InferencePool", *KEY)
    assert body is not None
    return body


def warnings(kube: FakeKube) -> list[str]:
    return [e["message"] for e in kube.of_kind("Event", "ns") if e["reason"] == "ObjectNotOwned"]


NEW_POOL = [(o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in desired() if o["kind"] != "ConfigMap"]


@pytest.mark.parametrize(("api_version", "kind", "name"), NEW_POOL, ids=[f"{k}-{n}" for _, k, n in NEW_POOL])
async def test_a_new_pool_whose_name_is_taken_writes_nothing_until_the_object_goes(
        kube: FakeKube, api_version: str, kind: str, name: str) -> None:
    theirs = kube.seed({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": "ns"},
                        "data": {"mine": "eA=="}})
    requeued: list[tuple[tuple[str, str], float]] = []
    controller = Controller(client=kube, cache=kube.cache(), requeue=lambda k, s: requeued.append((k, s)))

    for _ in range(3):
        await controller.reconcile(KEY)
    writes = kube.take_writes()
    assert {(w.verb, w.kind) for w in writes} == {("status", "InferencePool"), ("create", "Event")}, writes
    assert kube.get(kind, "ns", name) == theirs, "not patched, not adopted"
    cond = next(c for c in pool(kube)["status"]["conditions"] if c["type"] == "Accepted")
    assert (cond["status"], cond["reason"]) == ("False", "ObjectNotOwned")
    assert f"{kind} ns/{name} (no controller)" in cond["message"]
    assert warnings(kube) == [cond["message"]], "one Warning, not one per reconcile"
    assert requeued == [(KEY, ownership.RECHECK_S)] * 3  # an unlabelled object's going makes no event

    kube.remove(kind, "ns", name)
    await controller.reconcile(KEY)
    made = kube.get(kind, "ns", name)
    assert made is not None and made["metadata"]["ownerReferences"][0]["uid"] == pool(kube)["metadata"]["uid"]
    cond = next(c for c in pool(kube)["status"]["conditions"] if c["type"] == "Accepted")
    assert (cond["status"], cond["reason"]) == ("True", "Valid")


async def test_every_blocker_is_named_however_the_pool_is_looked_at_and_said_once(kube: FakeKube) -> None:
    """A new pool reads its Secret with its other objects; later reconciles read it before planning (the keys):
    either way the pool names the Deployment and the Secret, and its message does not change."""
    for kind, name, api_version in (("Deployment", "tiny-router", "apps/v1"), ("Secret", "tiny-router-key", "v1")):
        kube.seed({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": "ns"}})
    controller = Controller(client=kube, cache=kube.cache())
    for _ in range(3):
        await controller.reconcile(KEY)
    said = warnings(kube)
    assert len(said) == 1 and "Deployment ns/tiny-router" in said[0] and "Secret ns/tiny-router-key" in said[0]


async def test_a_running_pool_keeps_its_objects_while_a_new_one_is_blocked(kube: FakeKube) -> None:
    controller = Controller(client=kube, cache=kube.cache())
    for _ in range(3):
        await controller.reconcile(KEY)
    kube.take_writes()
    before = {k: v for k, v in kube.objects.items() if k[0] != "Event"}
    kube.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tiny-decode-1-0", "namespace": "ns"}})
    # Scaling to 2 decode groups and dropping the NetworkPolicies: neither the new group nor the deletions go out.
    kube.update("InferencePool", *KEY, lambda p: (p["spec"]["decode"].update(replicas=2),
                                                  p["spec"].update(networkPolicy={"enabled": False})))
    await controller.reconcile(KEY)
    writes = kube.take_writes()
    assert {(w.verb, w.kind) for w in writes} == {("status", "InferencePool"), ("create", "Event")}, writes
    assert all(kube.objects.get(k) == v for k, v in before.items() if k[0] != "InferencePool")
    assert "Pod ns/tiny-decode-1-0 (no controller)" in warnings(kube)[0]


async def test_a_secret_made_under_a_known_pools_key_name_is_not_read_for_keys_nor_written(kube: FakeKube) -> None:
    now = [0.0]
    keys = RouterKeys(kube, clock=lambda: now[0])
    controller = Controller(client=kube, cache=kube.cache(), router_keys=keys)
    for _ in range(3):
        await controller.reconcile(KEY)
    kube.remove("Secret", "ns", "tiny-router-key")
    theirs = kube.seed({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tiny-router-key",
                                                                           "namespace": "ns"},
                        "data": {"key-1": "dGhlaXJz"}})
    kube.take_writes()
    now[0] += 61  # the operator reads the Secret again (kube.router_key_secrets.REFRESH_S)
    await controller.reconcile(KEY)
    assert {(w.verb, w.kind) for w in kube.take_writes()} == {("status", "InferencePool"), ("create", "Event")}
    assert kube.get("Secret", "ns", "tiny-router-key") == theirs
    assert "Secret ns/tiny-router-key (no controller)" in warnings(kube)[0]
