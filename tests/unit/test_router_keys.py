"""The router's control-plane key: made once, rotated on request with the old key valid while a router pod still
holds it, never logged. Pure decisions first, then the executor against the in-memory apiserver."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import logging

import pytest

from pdfleet.operator.controller import Controller
from pdfleet.operator.kube.router_key_secrets import RouterKeys
from pdfleet.operator.planning.router import router_keys
from pdfleet.operator.planning.router.router_keys import KeySet
from pdfleet.operator.render import desired, labels, router_secret
from tests.support.fake_kube import FakeKube
from tests.support.pools import pool_body
from tests.unit.test_render import CTX, spec_of

KEY = ("ns", "tiny")


def counter() -> itertools.count[int]:
    return itertools.count(1)


def keys_from(n: itertools.count[int]) -> object:
    return lambda: f"secret-value-{next(n)}"


def test_a_pool_without_keys_gets_its_first() -> None:
    made, rotated = router_keys.decide(None, rotate="", referenced=set(), new_key=lambda: "v1")
    assert (made.current, dict(made.keys), rotated) == ("key-1", {"key-1": "v1"}, False)


def test_a_rotation_adds_a_new_key_and_keeps_the_old_while_a_router_pod_refers_to_it() -> None:
    start = KeySet(current="key-1", keys={"key-1": "v1"}, handled="")
    rotated, began = router_keys.decide(start, rotate="2026-12-03T03:00:00Z", referenced={"key-1"},
                                        new_key=lambda: "v2")
    assert began and rotated.current == "key-2" and dict(rotated.keys) == {"key-1": "v1", "key-2": "v2"}
    # The same request is not a new rotation; once no pod refers to key-1, it goes.
    again, began = router_keys.decide(rotated, rotate="2026-12-03T03:00:00Z", referenced={"key-1", "key-2"},
                                      new_key=lambda: "never")
    assert not began and again == rotated
    done, _ = router_keys.decide(rotated, rotate="2026-12-03T03:00:00Z", referenced={"key-2"},
                                 new_key=lambda: "never")
    assert dict(done.keys) == {"key-2": "v2"}


def test_a_current_key_edited_away_is_replaced_under_a_new_name_never_reused() -> None:
    secret = router_secret.secret("tiny", "ns", {}, keys={"key-3": "v3"}, current="key-4", handled="")
    parsed = router_keys.parse(secret)
    assert parsed is not None and parsed.current == ""
    made, _ = router_keys.decide(parsed, rotate="", referenced={"key-3"}, new_key=lambda: "v5")
    assert made.current == "key-5" and dict(made.keys) == {"key-3": "v3", "key-5": "v5"}


def test_the_secret_round_trips_and_no_repr_shows_a_key() -> None:
    keys = KeySet(current="key-2", keys={"key-1": "v1", "key-2": "v2"}, handled="r")
    body = router_secret.secret("tiny", "ns", {"uid": "u"}, keys=keys.keys, current=keys.current,
                                handled=keys.handled)
    assert router_keys.parse(body) == keys
    assert "v1" not in repr(keys) and "v2" not in repr(keys)


def router_pod(key: str) -> dict[str, object]:
    """A pod of the router Deployment's ReplicaSet, started with `key`."""
    return {"metadata": {"name": f"tiny-router-{key}", "namespace": "ns", "labels": labels.common("tiny", "router"),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "tiny-router-6f9c",
                                              "uid": "uid-rs", "controller": True}]},
            "spec": {"containers": [{"name": "router", "env": [{"name": router_secret.ENV, "valueFrom": {
                "secretKeyRef": {"name": "tiny-router-key", "key": key}}}]}]}}


def stored(kube: FakeKube) -> dict[str, str]:
    secret = kube.get("Secret", "ns", "tiny-router-key")
    assert secret is not None
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


async def test_rotation_through_the_executor_restarts_routers_onto_the_new_key_and_prunes_the_old(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    kube = FakeKube()
    kube.seed(pool_body())
    n = counter()
    controller = Controller(client=kube, cache=kube.cache(),
                            router_keys=RouterKeys(kube, new_key=keys_from(n)))  # type: ignore[arg-type]
    await controller.reconcile(KEY)
    assert stored(kube) == {"key-1": "secret-value-1"}
    template = kube.get("Deployment", "ns", "tiny-router")["spec"]["template"]["spec"]  # type: ignore[index]
    assert router_secret.referenced_key({"spec": template}, "tiny") == "key-1"
    assert controller.router_keys.for_pod(router_pod("key-1")) == "secret-value-1"

    kube.update("InferencePool", *KEY, lambda p: p["metadata"].setdefault("annotations", {}).update(
        {router_keys.ROTATE_ANNOTATION: "now"}))
    kube.seed(router_pod("key-1") | {"apiVersion": "v1", "kind": "Pod"})  # an old router pod, still running
    await controller.reconcile(KEY)
    assert stored(kube) == {"key-1": "secret-value-1", "key-2": "secret-value-2"}
    template = kube.get("Deployment", "ns", "tiny-router")["spec"]["template"]["spec"]  # type: ignore[index]
    assert router_secret.referenced_key({"spec": template}, "tiny") == "key-2"
    assert [e["reason"] for e in kube.of_kind("Event", "ns")].count("RouterKeyRotated") == 1
    # Each router pod is called with the key it started with.
    assert controller.router_keys.for_pod(router_pod("key-1")) == "secret-value-1"
    assert controller.router_keys.for_pod(router_pod("key-2")) == "secret-value-2"
    assert "secret-value" not in caplog.text
    assert all("secret-value" not in str(e) for e in kube.of_kind("Event", "ns"))


async def test_a_secret_deleted_by_hand_is_made_again_keeping_the_keys_router_pods_use_under_their_names() -> None:
    kube = FakeKube()
    kube.seed(pool_body())
    now = [0.0]
    keys = RouterKeys(kube, new_key=keys_from(counter()), clock=lambda: now[0])  # type: ignore[arg-type]
    pool = kube.get("InferencePool", *KEY)
    assert pool is not None
    await keys.ensure(pool, [])
    kube.remove("Secret", "ns", "tiny-router-key")
    now[0] += 120  # past the refresh: the operator reads the Secret again
    made, _ = await keys.ensure(pool, [router_pod("key-1")])
    assert stored(kube) == {"key-1": "secret-value-1", "key-2": "secret-value-2"}
    assert made.current == "key-2", "a name router pods used is never given a new value"
    # An operator that remembers nothing (restarted) still numbers above what router pods use.
    kube.remove("Secret", "ns", "tiny-router-key")
    fresh = RouterKeys(kube, new_key=lambda: "after-restart")  # type: ignore[arg-type]
    made, _ = await fresh.ensure(pool, [router_pod("key-2")])
    assert made.current == "key-3" and stored(kube) == {"key-3": "after-restart"}


def test_the_router_takes_its_key_by_reference_audits_its_control_plane_and_drains_before_it_stops() -> None:
    ctx = dataclasses.replace(CTX, router_key="key-7")
    deployment = next(o for o in desired.desired(ctx, spec_of()).router if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    keys = args[args.index("--control-plane-api-keys") + 1]
    assert keys == f"pdfleet-operator:pdfleet operator:admin:$({router_secret.ENV})"
    assert "--control-plane-audit-enabled" in args
    assert container["env"] == [{"name": router_secret.ENV, "valueFrom": {"secretKeyRef": {
        "name": "p-router-key", "key": "key-7"}}}]
    assert router_secret.referenced_key({"spec": deployment["spec"]["template"]["spec"]}, "p") == "key-7"
    assert container["lifecycle"]["preStop"]["exec"]["command"][:2] == ["python3", "-c"]
