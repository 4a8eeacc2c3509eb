"""The cache groups managed objects under their pool and hands out snapshots that later events cannot change."""

from __future__ import annotations

from pdfleet.operator.cache import Cache
from pdfleet.operator.render import labels


def pod(name: str, pool: str = "p", namespace: str = "ns") -> dict:
    owner = {"apiVersion": "pdfleet.dev/v1alpha1", "kind": "InferencePool", "name": pool, "uid": "u",
             "controller": True}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {labels.POOL: pool},
                         "ownerReferences": [owner]}}


def test_owned_objects_are_grouped_under_the_pool_their_label_names() -> None:
    cache = Cache()
    assert cache.record_owned("v1", "Pod", "ADDED", pod("a")) == ("ns", "p")
    cache.record_owned("v1", "Pod", "ADDED", pod("b"))
    cache.record_owned("v1", "Pod", "ADDED", pod("c", pool="other"))
    assert [p["metadata"]["name"] for p in cache.snapshot(("ns", "p")).of_kind("Pod")] == ["a", "b"]


def test_an_object_the_pool_does_not_control_is_ignored_even_with_the_pools_labels() -> None:
    cache = Cache()
    body = pod("router-abc")
    body["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                            "uid": "u", "controller": True}]
    assert cache.record_owned("v1", "Pod", "ADDED", body) is None
    assert cache.snapshot(("ns", "p")).owned == {}


def test_deleted_objects_leave_the_snapshot() -> None:
    cache = Cache()
    cache.record_owned("v1", "Pod", "ADDED", pod("a"))
    cache.record_owned("v1", "Pod", "DELETED", pod("a"))
    assert cache.snapshot(("ns", "p")).owned == {}


def test_a_snapshot_does_not_change_when_later_events_arrive() -> None:
    cache = Cache()
    cache.record_pool("ADDED", {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"x": 1}})
    snap = cache.snapshot(("ns", "p"))
    cache.record_pool("MODIFIED", {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"x": 2}})
    assert snap.pool is not None and snap.pool["spec"] == {"x": 1}
    cache.record_pool("DELETED", {"metadata": {"name": "p", "namespace": "ns"}})
    assert cache.snapshot(("ns", "p")).pool is None
    assert cache.pool_keys() == []
