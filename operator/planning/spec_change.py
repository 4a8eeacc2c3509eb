"""Changes the operator (or the `pdfleet` CLI) makes to a pool's own object: its spec and its annotations, as one
JSON Patch (RFC 6902). Pure: the patch is computed here and sent by the executor (`kube/pool_patch.py`).

Every patch starts with a `test` of `metadata.generation`, the spec version the decision was made from. The status
writes between planning and patching do not move it (only a spec change does), so a decision about a spec that
someone changed in the meantime is refused by the apiserver instead of written over the newer spec, and a decision
made twice (a reconcile after a restart, planning from a cache that has not shown the first patch yet) is applied
at most once: the first patch moves the generation, the second one's test fails.

Used by automatic rollback (`rollback.py`), `pdfleet rollout undo|pause|resume`, and recording the last verified
spec; the overlap-desync playbook changes `spec.engine.overlapSchedule` with `patch` too.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

Body = dict[str, Any]
Record = TypeVar("Record", bound=BaseModel)
Path = tuple[str, ...]  # a path from the object's root: ("spec", "engine", "overlapSchedule")


class _Remove:
    """The value `patch` takes to remove a field."""

    def __repr__(self) -> str:
        return "REMOVE"


REMOVE: Any = _Remove()


def annotation(pool: Mapping[str, Any], key: str) -> str | None:
    return ((pool.get("metadata") or {}).get("annotations") or {}).get(key)


def annotation_record(pool: Mapping[str, Any], key: str, model: type[Record]) -> Record | None:
    """A JSON record the operator keeps in a pool annotation; None when absent or unreadable by this pdfleet."""
    raw = annotation(pool, key)
    try:
        return model.model_validate_json(raw) if raw else None
    except ValidationError:
        return None


@dataclasses.dataclass(frozen=True)
class SpecChange:
    """A JSON Patch of the pool, and why (for the log and for whoever reads the plan)."""

    ops: tuple[Body, ...]
    why: str

    @property
    def changes_spec(self) -> bool:
        return any(op["path"].startswith("/spec/") for op in self.ops if op["op"] != "test")


def pointer(path: Path) -> str:
    """RFC 6901: '~' and '/' in a segment are escaped ('pdfleet.dev/verified-spec' -> 'pdfleet.dev~1verified-spec')."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def _nested(path: Path, value: Any) -> Any:
    for key in reversed(path):
        value = {key: value}
    return value


def _op(body: Mapping[str, Any], path: Path, value: Any) -> Body | None:
    """The operation that makes `path` hold `value` in `body` (or removes it): `add` replaces an existing member,
    and a missing parent is added with the value nested in it (`add` needs the parent to exist). None: nothing
    to do (already so, or removing what is not there)."""
    node: Any = body
    for depth, key in enumerate(path[:-1]):
        if not isinstance(node, Mapping) or key not in node:
            if value is REMOVE:
                return None
            return {"op": "add", "path": pointer(path[:depth + 1]), "value": _nested(path[depth + 1:], value)}
        node = node[key]
    last = path[-1]
    if value is REMOVE:
        return {"op": "remove", "path": pointer(path)} if isinstance(node, Mapping) and last in node else None
    if isinstance(node, Mapping) and node.get(last, REMOVE) == value:
        return None
    return {"op": "add", "path": pointer(path), "value": copy.deepcopy(value)}


def patch(pool: Mapping[str, Any], changes: Mapping[Path, Any], *, annotations: Mapping[str, str | None] | None = None,
          why: str) -> SpecChange | None:
    """A patch setting each path of `changes` to its value (`REMOVE` removes it) and each annotation (None removes
    it), guarded by the pool's generation. None when the pool already says all of it."""
    meta = pool.get("metadata") or {}
    wanted: dict[Path, Any] = dict(changes)
    wanted.update({("metadata", "annotations", k): REMOVE if v is None else v
                   for k, v in (annotations or {}).items()})
    ops = [op for path, value in wanted.items() if (op := _op(pool, path, value)) is not None]
    if not ops:
        return None
    return SpecChange(ops=({"op": "test", "path": "/metadata/generation", "value": meta.get("generation")},
                           *_merge_parents(ops)), why=why)


def _merge_parents(ops: Sequence[Body]) -> list[Body]:
    """Two changes under one missing parent (two annotations on a pool that has none) would each add the parent,
    the second replacing the first: fold them into one `add` of the parent."""
    out: list[Body] = []
    for op in ops:
        same = next((o for o in out if o["op"] == "add" and o["path"] == op["path"] and op["op"] == "add"
                     and isinstance(o["value"], dict) and isinstance(op["value"], dict)), None)
        if same is not None:
            same["value"] = {**same["value"], **op["value"]}
        else:
            out.append(dict(op))
    return out


def apply(body: Mapping[str, Any], change: SpecChange) -> Body:
    """What the apiserver stores after `change` (the subset of JSON Patch `patch` writes: test, add, remove); for
    tests and for planning from a patch the watch has not shown yet. A failed test raises ValueError, as the
    apiserver refuses the patch."""
    out = copy.deepcopy(dict(body))
    for op in change.ops:
        keys = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = out
        for key in keys[:-1]:
            parent = parent[key]
        if op["op"] == "test":
            if parent.get(keys[-1]) != op["value"]:
                raise ValueError(f"test failed: {op['path']} is {parent.get(keys[-1])!r}, not {op['value']!r}")
        elif op["op"] == "add":
            parent[keys[-1]] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[keys[-1]]
    return out
