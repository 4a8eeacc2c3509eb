"""Keeps each pool's InferencePoolRoles and its replicas in step: on every event of a pool or of one of its
InferencePoolRoles, reads both from kopf's indices, asks `planning.scale.role_scale_plan` what to do and has
`kube.role_scale_executor` do it. One pool at a time (a lock per pool), and planned from what this process last wrote
where the watch has not shown it yet: planning from a stale InferencePoolRole status, or a stale pool, would take
the other side's older number for a new one and write it back."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pdfleet.operator import metrics
from pdfleet.operator.cache import IndexView, PoolKey
from pdfleet.operator.kube import role_scale_executor
from pdfleet.operator.kube.kube_client import KubeClient, KubeError
from pdfleet.operator.planning.scale import role_scale_plan

log = logging.getLogger(__name__)

Body = dict[str, Any]
RETRY_AFTER = 5.0  # seconds before a failed sync is tried again, when no event has retried it meanwhile


def _generation(body: Mapping[str, Any] | None) -> int:
    return int(((body or {}).get("metadata") or {}).get("generation") or 0)


class RoleScaler:
    def __init__(self, *, client: KubeClient, pool: Callable[[PoolKey], Body | None], objects: IndexView) -> None:
        self._client = client
        self._pool = pool
        self._objects = objects
        self._locks: collections.defaultdict[PoolKey, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self._pools: dict[PoolKey, Body] = {}  # a pool as our spec patch stored it
        self._observed: dict[tuple[str, str], int] = {}  # (namespace, InferencePoolRole) -> observedGeneration
        self._retries: dict[PoolKey, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def forget(self, key: PoolKey) -> None:
        retry = self._retries.pop(key, None)
        if retry is not None:
            retry.cancel()
        self._locks.pop(key, None)
        self._pools.pop(key, None)
        for name in [n for n in self._observed if n[0] == key[0] and n[1].startswith(f"{key[1]}-")]:
            del self._observed[name]

    def _latest_pool(self, key: PoolKey) -> Body | None:
        seen, ours = self._pool(key), self._pools.get(key)
        if ours is not None and (seen is None or _generation(ours) > _generation(seen)):
            # Our patch's answer is newer than the watch; its status is as old as the patch, which is fine for
            # counts the next event refreshes.
            return ours
        self._pools.pop(key, None)
        return seen

    def _latest_objects(self, key: PoolKey) -> list[Body]:
        out = []
        for body in self._objects.get(key, ()):
            name = (key[0], body["metadata"]["name"])
            status = body.get("status") or {}
            ours = self._observed.get(name)
            if ours is not None and ours > int(status.get("observedGeneration") or 0):
                body = {**body, "status": {**status, "observedGeneration": ours}}
            out.append(body)
        return out

    def _retry_later(self, key: PoolKey) -> None:
        """A failed write is tried again by the next event, or after RETRY_AFTER if none comes: level-based."""
        if key in self._retries:
            return

        def fire() -> None:
            self._retries.pop(key, None)
            task = asyncio.ensure_future(self.sync(key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self._retries[key] = asyncio.get_running_loop().call_later(RETRY_AFTER, fire)

    async def sync(self, key: PoolKey) -> None:
        async with self._locks[key]:
            pool = self._latest_pool(key)
            objects = self._latest_objects(key)
            if pool is None or pool["metadata"].get("deletionTimestamp"):
                return
            spec = pool.get("spec") or {}
            if not objects and not any((spec.get(role) or {}).get("scaleTarget") for role in ("prefill", "decode")):
                return
            plan = role_scale_plan.plan(pool, objects)
            if not plan.steps and plan.pool_change is None and not plan.events:
                return
            try:
                written = await role_scale_executor.execute(self._client, pool, plan)
            except KubeError as e:
                log.warning("could not sync the InferencePoolRoles of %s/%s (retrying): %s", key[0], key[1], e)
                self._retry_later(key)
                return
            if plan.pool_change is None or written.pool is not None:  # a scale not written is decided again
                for role, result in plan.results:
                    metrics.ROLE_SCALES.labels(role=str(role), result=result).inc()
            if written.pool is not None:
                self._pools[key] = written.pool
            for name, generation in written.observed.items():
                self._observed[(key[0], name)] = generation
