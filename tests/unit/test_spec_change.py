"""The operator's own changes to a pool: JSON Patches guarded by the generation they were decided on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pdfleet.operator.kube import pool_patch
from pdfleet.operator.kube.kube_client import KubeError
from pdfleet.operator.planning import spec_change
from pdfleet.operator.planning.spec_change import REMOVE
from tests.support.pools import pool_body


def pool(generation: int = 3, annotations: dict[str, str] | None = None) -> dict:
    body = pool_body(prefill=1, decode=1)
    body["metadata"]["generation"] = generation
    if annotations is not None:
        body["metadata"]["annotations"] = annotations
    return body


def test_a_change_is_guarded_by_the_generation_it_was_decided_on() -> None:
    change = spec_change.patch(pool(), {("spec", "engine", "overlapSchedule"): "Disabled"}, why="playbook")
    assert change is not None and change.changes_spec
    assert change.ops[0] == {"op": "test", "path": "/metadata/generation", "value": 3}
    assert change.ops[1] == {"op": "add", "path": "/spec/engine/overlapSchedule", "value": "Disabled"}
    assert spec_change.apply(pool(), change)["spec"]["engine"]["overlapSchedule"] == "Disabled"
    with pytest.raises(ValueError, match="test failed"):
        spec_change.apply(pool(generation=4), change)


def test_nothing_to_change_is_no_patch() -> None:
    body = pool(annotations={"a": "1"})
    body["spec"]["engine"]["overlapSchedule"] = "Disabled"
    assert spec_change.patch(body, {("spec", "engine", "overlapSchedule"): "Disabled"},
                             annotations={"a": "1", "b": None}, why="noop") is None
    assert spec_change.patch(body, {("spec", "health", "nothing", "here"): REMOVE}, why="noop") is None


def test_missing_parents_are_added_once_and_annotation_keys_are_escaped() -> None:
    body = pool()
    change = spec_change.patch(body, {}, annotations={"pdfleet.dev/a": "1", "pdfleet.dev/b": "2"}, why="record")
    assert change is not None and not change.changes_spec
    assert change.ops[1:] == ({"op": "add", "path": "/metadata/annotations",
                               "value": {"pdfleet.dev/a": "1", "pdfleet.dev/b": "2"}},)
    stored = spec_change.apply(body, change)
    again = spec_change.patch(stored, {}, annotations={"pdfleet.dev/a": "3", "pdfleet.dev/b": None}, why="again")
    assert again is not None
    assert again.ops[1:] == ({"op": "add", "path": "/metadata/annotations/pdfleet.dev~1a", "value": "3"},
                             {"op": "remove", "path": "/metadata/annotations/pdfleet.dev~1b"})
    assert spec_change.apply(stored, again)["metadata"]["annotations"] == {"pdfleet.dev/a": "3"}


class FakeApi:
    """Answers a patch as the apiserver does: 422 with a generic message when its generation test fails."""

    def __init__(self, stored: dict, *, refuse: KubeError | None = None) -> None:
        self.stored, self.refuse, self.calls = stored, refuse, []

    async def request(self, method: str, path: str, *, body: Any = None, content_type: str = "",
                      **_: Any) -> dict:
        self.calls.append((method, content_type))
        if method == "GET":
            return self.stored
        if self.refuse is not None:
            raise self.refuse
        try:
            self.stored = spec_change.apply(self.stored, spec_change.SpecChange(ops=tuple(body), why=""))
        except ValueError:
            raise KubeError(422, "Invalid", "the server rejected our request due to an error in our request") \
                from None
        return self.stored


def test_a_refused_test_of_the_generation_is_no_change_and_any_other_refusal_raises() -> None:
    change = spec_change.patch(pool(), {("spec", "rollout", "paused"): True}, why="pause")
    assert change is not None
    api = FakeApi(pool(generation=4))
    assert asyncio.run(pool_patch.patch_pool(api, pool(), change)) is None  # type: ignore[arg-type]
    assert api.calls == [("PATCH", "application/json-patch+json"), ("GET", "")]
    api = FakeApi(pool())
    stored = asyncio.run(pool_patch.patch_pool(api, pool(), change))  # type: ignore[arg-type]
    assert stored is not None and stored["spec"]["rollout"]["paused"] is True
    invalid = KubeError(422, "Invalid", 'InferencePool.pdfleet.dev "tiny" is invalid: spec.rollout.paused: ...')
    with pytest.raises(KubeError, match="is invalid"):
        asyncio.run(pool_patch.patch_pool(FakeApi(pool(), refuse=invalid), pool(), change))  # type: ignore[arg-type]
