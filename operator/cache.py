"""What the operator has seen of the cluster, kept current by watch events (an informer cache).

Reconciles read from here, not from the API: at steady state the operator sends no reads and no writes.
The cache holds raw bodies; it makes no decisions and performs no I/O.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from pdfleet.operator.kube import resources

Body = dict[str, Any]
PoolKey = tuple[str, str]  # (namespace, name)
ObjectKey = tuple[str, str]  # (kind, name)


@dataclasses.dataclass(frozen=True)
class Observed:
    """One pool and the objects it owns, as last seen. A snapshot: later events do not change it."""

    pool: Body | None
    owned: Mapping[ObjectKey, Body]

    def of_kind(self, kind: str) -> list[Body]:
        return [body for (k, _), body in sorted(self.owned.items()) if k == kind]


def owning_pool(meta: Mapping[str, Any]) -> str | None:
    """The pool that controls an object, by its controller owner reference. Labels are not enough: the router
    Deployment's pods carry the pool's labels but belong to a ReplicaSet, and must never be judged as ours."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "InferencePool" and \
                str(ref.get("apiVersion", "")).startswith(f"{resources.GROUP}/"):
            return ref.get("name")
    return None


class Cache:
    def __init__(self) -> None:
        self._pools: dict[PoolKey, Body] = {}
        self._owned: dict[PoolKey, dict[ObjectKey, Body]] = {}

    def record_pool(self, event_type: str | None, body: Mapping[str, Any]) -> PoolKey:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if event_type == "DELETED":
            self._pools.pop(key, None)
        else:
            self._pools[key] = copy.deepcopy(dict(body))
        return key

    def record_owned(self, api_version: str, kind: str, event_type: str | None,
                     body: Mapping[str, Any]) -> PoolKey | None:
        """Records an object pdfleet manages; returns the key of its pool, or None if it names none.
        The type is given because objects from an initial list carry no kind of their own."""
        meta = body["metadata"]
        pool = owning_pool(meta)
        if not pool:
            return None
        key = (meta["namespace"], pool)
        objects = self._owned.setdefault(key, {})
        obj_key = (kind, meta["name"])
        if event_type == "DELETED":
            objects.pop(obj_key, None)
            if not objects:
                self._owned.pop(key, None)
        else:
            objects[obj_key] = {**copy.deepcopy(dict(body)), "apiVersion": api_version, "kind": kind}
        return key

    def snapshot(self, key: PoolKey) -> Observed:
        pool = self._pools.get(key)
        return Observed(pool=copy.deepcopy(pool) if pool else None,
                        owned={k: copy.deepcopy(v) for k, v in self._owned.get(key, {}).items()})

    def pool_keys(self) -> list[PoolKey]:
        return sorted(self._pools)
