"""The operator's own changes to a pool: JSON Patches guarded by the generation they were decided on."""

from __future__ import annotations

import pytest

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
