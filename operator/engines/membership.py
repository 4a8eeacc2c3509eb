"""Keeps every router of a pool sending requests to exactly the engines the operator holds in rotation
(`planning.router_membership` decides; this module asks the routers and acts). Called after each rank-health
poll, so a group judged sick leaves rotation within one heartbeat.

A router that does not answer is skipped until the next poll; nothing here ever raises into the monitor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pdfleet.operator import metrics
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.cache import Observed, PoolKey
from pdfleet.operator.engines.client import EngineClient
from pdfleet.operator.planning import router_membership
from pdfleet.operator.planning.plan import Event
from pdfleet.operator.planning.rank_health import GroupHealth

log = logging.getLogger(__name__)

Body = dict[str, Any]
PostEvent = Callable[[Mapping[str, Any], Event], Awaitable[None]]
RouterKey = Callable[[Mapping[str, Any]], "str | None"]  # a router pod -> the control-plane key it started with
GRACE_S = 5.0  # how long the router's own discovery gets to add a newly Ready engine before the operator does


def _serving(pod: Body) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and bool(status.get("podIP")) and \
        not pod["metadata"].get("deletionTimestamp")


class RouterMembership:
    def __init__(self, *, routers: EngineClient, key: RouterKey, post_event: PostEvent | None = None,
                 grace_s: float = GRACE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._routers = routers  # not ours to close: the operator's one client, shared
        self._key = key
        self._post_event = post_event
        self._grace = grace_s
        self._clock = clock
        # What each router lacks or has too much, since when: by pool, then by router pod uid. Per pool, because
        # each pool's poll sees only its own routers and must never forget another pool's.
        self._missing: dict[PoolKey, dict[str, Mapping[str, float]]] = {}
        self._unwanted: dict[PoolKey, dict[str, Mapping[str, float]]] = {}

    async def sync(self, key: PoolKey, spec: InferencePoolSpec, observed: Observed,
                   health: Mapping[str, GroupHealth]) -> None:
        routers = [p for p in observed.routers if _serving(p)]
        if not routers or observed.pool is None:
            log.debug("no serving router of %s/%s (%d known)", *key, len(observed.routers))
            self._missing.pop(key, None)
            self._unwanted.pop(key, None)
            return
        missing = self._missing.setdefault(key, {})
        unwanted = self._unwanted.setdefault(key, {})
        wanted, left_out = router_membership.in_rotation(spec, observed.of_kind("Pod"),
                                                         {n: h.verdict for n, h in health.items()})
        for router in routers:
            uid = router["metadata"].get("uid", "")
            port = spec.router.port
            key_ = self._key(router)
            registered = await self._routers.workers(router, port, key_)
            if registered is None:
                continue
            changes = router_membership.plan(wanted, registered, left_out, missing_since=missing.get(uid, {}),
                                             unwanted_since=unwanted.get(uid, {}), now=self._clock(),
                                             grace=self._grace)
            missing[uid] = changes.missing_since
            unwanted[uid] = changes.unwanted_since
            if changes.missing_since or changes.unwanted_since:
                log.debug("router %s: waiting out the grace for %s", router["metadata"]["name"],
                          sorted({*changes.missing_since, *changes.unwanted_since}))
            await self._apply(observed.pool, router, port, key_, changes)
        alive = {r["metadata"].get("uid", "") for r in routers}
        for uid in [u for u in missing if u not in alive]:
            del missing[uid]
            unwanted.pop(uid, None)

    async def _apply(self, pool: Body, router_pod: Body, port: int, key: str | None,
                     changes: router_membership.Changes) -> None:
        router = router_pod["metadata"]["name"]
        meta = pool["metadata"]
        where = {"namespace": meta["namespace"], "pool": meta["name"], "router": router}
        for removal in changes.remove:
            if not await self._routers.remove_worker(router_pod, port, key, removal.worker):
                continue
            metrics.ROUTER_WORKER_CHANGES.labels(action="remove", reason=_reason_label(removal.reason)).inc()
            log.info("router %s: removed worker %s (%s)", router, removal.worker.url, removal.reason, extra=where)
            sick = removal.reason in {str(v) for v in router_membership.SICK}
            await self._event(pool, Event(
                "Warning" if sick else "Normal", "RouterWorkerRemoved",
                f"router {router} no longer sends requests to {removal.worker.worker_type} worker "
                f"{removal.worker.url}: {removal.reason}"))
        for worker in changes.add:
            if not await self._routers.add_worker(router_pod, port, key, worker):
                continue
            metrics.ROUTER_WORKER_CHANGES.labels(action="add", reason="in rotation").inc()
            log.info("router %s: added worker %s of group %s", router, worker.url, worker.group, extra=where)
            await self._event(pool, Event("Normal", "RouterWorkerAdded",
                                          f"router {router} sends requests to {worker.role} group {worker.group} "
                                          f"({worker.url}) again"))

    async def _event(self, pool: Body, event: Event) -> None:
        if self._post_event is not None:
            await self._post_event(pool, event)


def _reason_label(reason: str) -> str:
    """A bounded set of metric label values: verdicts and the planner's fixed reasons."""
    if reason in {str(v) for v in router_membership.SICK} or reason in ("terminating", "not Ready"):
        return reason
    if reason.startswith("registered as"):
        return "wrong role"
    return "stale"
