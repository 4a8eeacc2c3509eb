"""What the operator has seen of the cluster: a read-only view over kopf's in-memory indices.

kopf keeps the indices current from its watch streams and, crucially, holds back every event handler until all
indices are filled from their initial listings. So the first reconcile of a pool (triggered by its event
handler) sees every object the pool owns, and a restarted operator never mistakes "not listed yet" for
"missing". Reconciles read from here, not from the API: at steady state the operator sends no reads and no
writes. This module makes no decisions and performs no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from pdfleet.operator.api import meta as api_meta
from pdfleet.operator.render import labels
from pdfleet.operator.render.router_objects import router_name

Body = dict[str, Any]
PoolKey = tuple[str, str]  # (namespace, name)
ObjectKey = tuple[str, str]  # (kind, name)
# What kopf.Index is, structurally: a key maps to the values of every object indexed under it.
IndexView = Mapping[PoolKey, Iterable[Body]]


@dataclasses.dataclass(frozen=True)
class Observed:
    """One pool and the objects it owns, as last seen. A snapshot: later events do not change it."""

    pool: Body | None
    owned: Mapping[ObjectKey, Body]
    # The pool's router pods. They belong to the router Deployment's ReplicaSet, not to the pool, so they are
    # never among `owned` (never judged, restarted or deleted as the pool's); the routers' membership reads them.
    routers: tuple[Body, ...] = ()

    def of_kind(self, kind: str) -> list[Body]:
        return [body for (k, _), body in sorted(self.owned.items()) if k == kind]


def owning_pool(meta: Mapping[str, Any]) -> str | None:
    """The pool that controls an object, by its controller owner reference. Labels are not enough: the router
    Deployment's pods carry the pool's labels but belong to a ReplicaSet, and must never be judged as ours."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == api_meta.KIND and \
                str(ref.get("apiVersion", "")).startswith(f"{api_meta.GROUP}/"):
            return ref.get("name")
    return None


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON document (what a watch event's body is): several times faster than
    `copy.deepcopy`, which a burst of pod events otherwise spends a tenth of the operator's time in."""
    if isinstance(value, Mapping):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value


def entry_copy(body: Mapping[str, Any]) -> Body:
    """What an index keeps of a watched object: its body without `metadata.managedFields`, which nothing in the
    operator reads and which, for a pod that its scheduler, kubelet and the operator each wrote, is as large as
    the rest of it (memory for every object of every pool). The top level and metadata are new dicts; everything
    below is the event's own parsed JSON, shared, not copied: kopf parses every watch event afresh and neither it
    nor the operator writes into one (snapshots are read-only), and a deep copy of every event's body was 2.6% of
    the operator's CPU in the 100-pool benchmark (docs/operator-throughput.md)."""
    meta = body.get("metadata") or {}
    return {**{k: v for k, v in body.items() if k != "metadata"},
            "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def spec_unhandled(pool: Mapping[str, Any]) -> bool:
    """A pool whose current spec no reconcile has handled yet (new, or changed since its status was written):
    the work a person is waiting for, as opposed to following up on its objects."""
    observed = (pool.get("status") or {}).get("observedGeneration")
    return observed is None or observed != pool["metadata"].get("generation")


def pool_entry(body: Mapping[str, Any]) -> dict[PoolKey, Body]:
    """What the pool index stores for one pool."""
    meta = body["metadata"]
    return {(meta["namespace"], meta["name"]): entry_copy(body)}


def owned_entry(api_version: str, kind: str, body: Mapping[str, Any]) -> dict[PoolKey, Body] | None:
    """What an owned-object index stores for one object, or None for an object no pool controls. The type is
    set here because objects from an initial list carry no kind of their own."""
    meta = body["metadata"]
    pool = owning_pool(meta)
    if pool is None:
        return None
    return {(meta["namespace"], pool): {**entry_copy(body), "apiVersion": api_version, "kind": kind}}


def router_entry(body: Mapping[str, Any]) -> dict[PoolKey, Body] | None:
    """What the router-pod index stores for one pod, or None for a pod that is not a pool's router: its labels
    name the pool, and its controller is a ReplicaSet of that pool's router Deployment (labels alone could be
    copied by any pod in the namespace, which would then receive the operator's calls to the router API)."""
    meta = body["metadata"]
    pool = (meta.get("labels") or {}).get(labels.POOL)
    if not pool:
        return None
    prefix = f"{router_name(pool)}-"
    if not any(ref.get("controller") and ref.get("kind") == "ReplicaSet" and str(ref.get("name", "")).startswith(
            prefix) for ref in meta.get("ownerReferences") or []):
        return None
    return {(meta["namespace"], pool): {**entry_copy(body), "apiVersion": "v1", "kind": "Pod"}}


class Cache:
    def __init__(self, pools: IndexView, owned: Iterable[IndexView], routers: IndexView | None = None) -> None:
        self._pools = pools
        self._owned = tuple(owned)
        self._routers = routers

    def snapshot(self, key: PoolKey) -> Observed:
        """The pool and what it owns, by reference: the bodies are the entries' own copies, which nothing
        mutates (kopf replaces an entry on every event), so a snapshot stays as it was without copying.
        Copying here was 60% of the operator's CPU under load (benchmarks/bench_operator.py)."""
        pools = list(self._pools.get(key, ()))
        objects: dict[ObjectKey, Body] = {}
        for index in self._owned:
            for body in index.get(key, ()):
                objects[(body["kind"], body["metadata"]["name"])] = body
        routers = tuple(self._routers.get(key, ())) if self._routers is not None else ()
        return Observed(pool=pools[0] if pools else None, owned=objects, routers=routers)

    def pool_keys(self) -> list[PoolKey]:
        return sorted(self._pools)
