"""A credential for the engines comes from a Secret by reference (`spec.engine.env[].valueFrom.secretKeyRef`): the
pods carry the reference and kubelet (or the local pod runner) reads the key at start, so the value is in no pool,
pod spec, revision or rollback history. tests/integration/test_verified_rollout_e2e.py runs it on the local fleet."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from pdfleet.operator.api import InferencePool
from pdfleet.operator.cache import Observed
from pdfleet.operator.planning import reconcile
from pdfleet.operator.render.revision import pool_revision
from tests.support.pools import pool_body

FROM_SECRET = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}


def engine_env(pool: dict[str, Any]) -> list[list[dict[str, Any]]]:
    plan = reconcile.plan(pool, Observed(pool=pool, owned={}), now=datetime.datetime.now(datetime.UTC))
    assert plan.status is not None and "InvalidSpec" not in str(plan.status["conditions"]), plan.status
    return [next(c for c in o["spec"]["containers"] if c["name"] == "engine")["env"]
            for o in plan.apply if o["kind"] == "Pod"]


@pytest.mark.effect("spec.engine.env.valueFrom.secretKeyRef.name", "spec.engine.env.valueFrom.secretKeyRef.key")
def test_every_engine_container_takes_the_secret_s_key_by_reference() -> None:
    envs = engine_env(pool_body(engine__env=[FROM_SECRET, {"name": "PLAIN", "value": "1"}]))
    assert envs and all(FROM_SECRET in env and {"name": "PLAIN", "value": "1"} in env for env in envs)


@pytest.mark.effect("spec.engine.env.valueFrom.secretKeyRef.optional")
def test_optional_is_passed_on_only_when_written() -> None:
    optional = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token", "optional": True}}}
    assert all(optional in env for env in engine_env(pool_body(engine__env=[optional])))


def test_the_revision_names_the_reference_and_changes_only_with_it() -> None:
    def revision(env: list[dict[str, Any]]) -> str:
        return pool_revision(InferencePool.model_validate(pool_body(engine__env=env)).spec)

    other_key = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token-2"}}}
    assert revision([FROM_SECRET]) == revision([FROM_SECRET])
    assert revision([FROM_SECRET]) != revision([other_key]) != revision([])


@pytest.mark.parametrize("ref", [{"name": "Bad_Name", "key": "token"}, {"name": "hf", "key": "a/b"}, {"name": "hf"}])
def test_a_reference_kubelet_could_not_resolve_is_refused(ref: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="secretKeyRef"):
        InferencePool.model_validate(pool_body(engine__env=[{"name": "X", "valueFrom": {"secretKeyRef": ref}}]))
