"""The cache groups managed objects under the pool that controls them and hands out snapshots that later
events cannot change."""

from __future__ import annotations

import pytest

from pdfleet.operator import cache
from pdfleet.operator.cache import Cache, owned_entry, pool_entry


def pod(name: str, pool: str = "p", namespace: str = "ns", owner_kind: str = "InferencePool") -> dict:
    owner = {"apiVersion": "pdfleet.dev/v1alpha1" if owner_kind == "InferencePool" else "apps/v1",
             "kind": owner_kind, "name": pool, "uid": "u", "controller": True}
    return {"metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner]}}


def index(*entries: dict | None) -> dict:
    out: dict = {}
    for entry in entries:
        for key, value in (entry or {}).items():
            out.setdefault(key, []).append(value)
    return out


def test_entries_are_copies_so_later_changes_to_an_event_body_cannot_reach_the_cache() -> None:
    """The entry's top level and metadata are its own (below them it shares the event's parsed JSON, which
    nothing writes into: test_entries_keep_no_managed_fields_and_leave_the_event_body_as_it_was)."""
    body = pod("a")
    entry = owned_entry("v1", "Pod", body)
    body["metadata"]["name"] = "changed"
    assert entry is not None
    assert entry[("ns", "p")]["metadata"]["name"] == "a"


def test_owned_objects_are_grouped_under_the_pool_that_controls_them() -> None:
    pods = index(owned_entry("v1", "Pod", pod("a")), owned_entry("v1", "Pod", pod("b")),
                 owned_entry("v1", "Pod", pod("c", pool="other")))
    cache = Cache(pools={}, owned=[pods])
    assert [p["metadata"]["name"] for p in cache.snapshot(("ns", "p")).of_kind("Pod")] == ["a", "b"]
    assert cache.snapshot(("ns", "p")).of_kind("Pod")[0]["kind"] == "Pod"


def test_an_object_the_pool_does_not_control_is_not_indexed_even_with_the_pools_labels() -> None:
    router_pod = pod("router-abc", pool="rs", owner_kind="ReplicaSet")
    router_pod["metadata"]["labels"] = {"pdfleet.dev/pool": "p"}
    assert owned_entry("v1", "Pod", router_pod) is None


def test_a_snapshot_does_not_change_when_the_index_does() -> None:
    pools = index(pool_entry({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"x": 1}}))
    cache = Cache(pools=pools, owned=[])
    snap = cache.snapshot(("ns", "p"))
    # kopf replaces an entry on every event; entries are copies of the event bodies, never mutated.
    pools[("ns", "p")] = [pool_entry({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"x": 2}})[("ns", "p")]]
    assert snap.pool is not None
    assert snap.pool["spec"] == {"x": 1}
    assert cache.pool_keys() == [("ns", "p")]
    assert cache.snapshot(("ns", "gone")).pool is None


def _router_pod(pool: str, owner: dict | None) -> dict:
    meta: dict = {"name": f"{pool}-router-abc-xyz", "namespace": "ns",
                  "labels": {"pdfleet.dev/pool": pool, "app.kubernetes.io/component": "router"}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "status": {"podIP": "127.1.4.2"}}


def test_a_router_pod_is_its_pools_only_when_its_replicaset_is_the_pools_router() -> None:
    ours = {"kind": "ReplicaSet", "name": "tiny-router-abc", "controller": True}
    entry = cache.router_entry(_router_pod("tiny", ours))
    assert entry is not None and list(entry) == [("ns", "tiny")] and entry[("ns", "tiny")]["kind"] == "Pod"
    # The same labels on a pod someone else runs are not enough.
    assert cache.router_entry(_router_pod("tiny", {"kind": "ReplicaSet", "name": "evil-abc", "controller": True})) \
        is None
    assert cache.router_entry(_router_pod("tiny", None)) is None
    assert cache.router_entry(_router_pod("tiny", {**ours, "controller": False})) is None


def test_router_pods_are_in_the_snapshot_but_never_among_what_the_pool_owns() -> None:
    pod = _router_pod("tiny", {"kind": "ReplicaSet", "name": "tiny-router-abc", "controller": True})
    c = cache.Cache(pools={("ns", "tiny"): [{"metadata": {"name": "tiny"}}]}, owned=[],
                    routers={("ns", "tiny"): [pod]})
    snap = c.snapshot(("ns", "tiny"))
    assert snap.routers == (pod,) and snap.of_kind("Pod") == []


@pytest.mark.parametrize(("status", "generation", "unhandled"), [
    (None, 1, True),  # new: never reconciled
    ({"observedGeneration": 1}, 2, True),  # its spec changed since
    ({"observedGeneration": 2}, 2, False),  # only its status or objects moved
])
def test_a_pool_whose_spec_no_reconcile_handled_yet_is_urgent(status: dict | None, generation: int,
                                                               unhandled: bool) -> None:
    pool = {"metadata": {"name": "p", "namespace": "ns", "generation": generation}, "status": status}
    assert cache.spec_unhandled(pool) is unhandled


def test_entries_keep_no_managed_fields_and_leave_the_event_body_as_it_was() -> None:
    """Nothing in the operator reads managedFields, and for a pod written by its scheduler, kubelet and the
    operator they are as large as the rest: the indices keep everything else."""
    body = pod("tiny-decode-0-0", pool="tiny")
    body["metadata"]["managedFields"] = [{"manager": "kube-scheduler", "operation": "Update",
                                          "fieldsV1": {"f:status": {"f:conditions": {}}}}]
    body["status"] = {"phase": "Running"}
    entry = owned_entry("v1", "Pod", body)
    assert entry is not None
    kept = entry[("ns", "tiny")]
    assert "managedFields" not in kept["metadata"]
    assert kept["metadata"]["ownerReferences"] == body["metadata"]["ownerReferences"]
    assert kept["status"] == {"phase": "Running"}
    assert body["metadata"]["managedFields"][0]["manager"] == "kube-scheduler"
    # Below metadata the entry is the event's parsed JSON itself: a deep copy of every event's body was 2.6% of
    # the operator's CPU under load, for a body that kopf parsed for this event alone and nothing writes into.
    assert kept["status"] is body["status"] and kept["metadata"]["ownerReferences"] is body["metadata"][
        "ownerReferences"]
    pool = {"metadata": {"name": "tiny", "namespace": "ns", "managedFields": [{"manager": "kubectl"}]}, "spec": {}}
    assert pool_entry(pool)[("ns", "tiny")] == {"metadata": {"name": "tiny", "namespace": "ns"}, "spec": {}}
