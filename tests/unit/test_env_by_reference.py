"""A value for the engines or the router comes from a Secret's or ConfigMap's key by reference
(`spec.engine.env[].valueFrom`, `spec.router.env[].valueFrom`): the pods carry the reference and kubelet (or the local
pod runner) reads the key at start, so the value is in no pool, pod spec, revision or rollback history.
tests/integration/test_verified_rollout_e2e.py runs a Secret's on the local fleet, tests/integration/test_pod_runner.py
the runner's resolution of both kinds."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from pdfleet.operator.api import InferencePool
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.cache import Observed
from pdfleet.operator.planning import reconcile
from pdfleet.operator.planning.rollout import rollback
from pdfleet.operator.render import desired, labels, router_secret
from pdfleet.operator.render.revision import pool_revision
from tests.support.pools import NO_BAKE, pool_body
from tests.unit.test_planning import FakeCluster
from tests.unit.test_render import CTX

Body = dict[str, Any]
FROM_SECRET = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
FROM_CONFIG_MAP = {"name": "LOG_LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}}}
SECTIONS = pytest.mark.parametrize("section", ["engine", "router"])
SELECTORS = pytest.mark.parametrize("selector", ["secretKeyRef", "configMapKeyRef"])


def engine_env(pool: Body) -> list[list[Body]]:
    plan = reconcile.plan(pool, Observed(pool=pool, owned={}), now=datetime.datetime.now(datetime.UTC))
    assert plan.status is not None and "InvalidSpec" not in str(plan.status["conditions"]), plan.status
    return [next(c for c in o["spec"]["containers"] if c["name"] == "engine")["env"]
            for o in plan.apply if o["kind"] == "Pod"]


def router_deployment(env: list[Body]) -> Body:
    spec = InferencePoolSpec.model_validate(pool_body(router__env=env)["spec"])
    return next(o for o in desired.desired(CTX, spec).router if o["kind"] == "Deployment")


def router_env(env: list[Body]) -> list[Body]:
    [router] = [c for c in router_deployment(env)["spec"]["template"]["spec"]["containers"] if c["name"] == "router"]
    return router["env"]


def rendered(section: str, env: list[Body]) -> list[list[Body]]:
    """The env of every container the section's variables reach."""
    return engine_env(pool_body(engine__env=env)) if section == "engine" else [router_env(env)]


def ref(selector: str, **fields: Any) -> Body:
    return {"name": "X", "valueFrom": {selector: {"name": "obj", "key": "k", **fields}}}


@SECTIONS
@pytest.mark.effect("spec.*.env.valueFrom.secretKeyRef.name", "spec.*.env.valueFrom.secretKeyRef.key",
                    "spec.*.env.valueFrom.configMapKeyRef.name", "spec.*.env.valueFrom.configMapKeyRef.key")
def test_every_container_of_the_section_takes_the_keys_by_reference(section: str) -> None:
    envs = rendered(section, [FROM_SECRET, FROM_CONFIG_MAP, {"name": "PLAIN", "value": "1"}])
    assert envs and all(FROM_SECRET in env and FROM_CONFIG_MAP in env and {"name": "PLAIN", "value": "1"} in env
                        for env in envs)


@SECTIONS
@SELECTORS
@pytest.mark.effect("spec.*.env.valueFrom.secretKeyRef.optional", "spec.*.env.valueFrom.configMapKeyRef.optional")
def test_optional_is_passed_on_only_when_written(section: str, selector: str) -> None:
    for var in (ref(selector, optional=True), ref(selector, optional=False), ref(selector)):
        assert all(var in env for env in rendered(section, [var])), var


@pytest.mark.effect("spec.router.env.name", "spec.router.env.value")
def test_router_env_reaches_the_router_container_after_its_key() -> None:
    env = router_env([{"name": "RUST_LOG", "value": "debug"}, {"name": "EMPTY"}])
    assert env[0]["name"] == router_secret.ENV
    assert env[1:] == [{"name": "RUST_LOG", "value": "debug"}, {"name": "EMPTY", "value": ""}]


def test_router_env_stays_out_of_the_readiness_sidecar() -> None:
    spec = InferencePoolSpec.model_validate(pool_body(router__env=[{"name": "RUST_LOG", "value": "debug"}],
                                                      router__circuitBreaker={"enabled": True})["spec"])
    deployment = next(o for o in desired.desired(CTX, spec).router if o["kind"] == "Deployment")
    ready = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "ready")
    assert "RUST_LOG" not in {e["name"] for e in ready["env"]}


def test_a_change_of_router_env_rolls_the_router_and_leaves_the_engines() -> None:
    def applied_hash(env: list[Body]) -> str:
        return router_deployment(env)["metadata"]["annotations"][labels.APPLIED_HASH]

    def revision(env: list[Body]) -> str:
        return pool_revision(InferencePool.model_validate(pool_body(router__env=env)).spec)

    assert applied_hash([FROM_SECRET]) == applied_hash([FROM_SECRET])
    assert len({applied_hash([]), applied_hash([FROM_SECRET]), applied_hash([FROM_CONFIG_MAP])}) == 3
    assert revision([]) == revision([FROM_SECRET]) == revision([FROM_CONFIG_MAP])


def test_the_revision_names_the_reference_and_changes_only_with_it() -> None:
    def revision(env: list[Body]) -> str:
        return pool_revision(InferencePool.model_validate(pool_body(engine__env=env)).spec)

    other_key = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token-2"}}}
    from_config_map = {"name": "HF_TOKEN", "valueFrom": {"configMapKeyRef": {"name": "hf", "key": "token"}}}
    assert revision([FROM_SECRET]) == revision([FROM_SECRET])
    assert len({revision([FROM_SECRET]), revision([other_key]), revision([from_config_map]), revision([])}) == 4


def test_the_verified_spec_and_its_history_keep_the_references() -> None:
    cluster = FakeCluster(pool_body(**NO_BAKE, engine__env=[FROM_SECRET, FROM_CONFIG_MAP]))
    cluster.converge()
    record = rollback.recorded(cluster.pool)
    assert record is not None and record.spec["engine"]["env"] == [FROM_SECRET, FROM_CONFIG_MAP]
    [entry] = rollback.history(cluster.pool)
    assert entry.spec["engine"]["env"] == [FROM_SECRET, FROM_CONFIG_MAP]


@SELECTORS
@pytest.mark.parametrize("fields", [{"name": "Bad_Name", "key": "token"}, {"name": "hf", "key": "a/b"}, {"name": "hf"}])
def test_a_reference_kubelet_could_not_resolve_is_refused(selector: str, fields: Body) -> None:
    with pytest.raises(ValueError, match=selector):
        InferencePool.model_validate(pool_body(engine__env=[{"name": "X", "valueFrom": {selector: fields}}]))
