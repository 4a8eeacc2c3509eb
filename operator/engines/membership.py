"""Keeps every router of a pool sending requests to exactly the engines the operator holds in rotation
(`planning.router.router_membership` decides; this module asks the routers and acts). Called after each rank-health
poll, so a group judged sick leaves rotation within one heartbeat.

A router that does not answer is skipped until the next poll; nothing here ever raises into the monitor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pdfleet.operator import metrics
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.cache import Observed, PoolKey
from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.plan import Event
from pdfleet.operator.planning.router import router_breakers, router_membership
from pdfleet.operator.planning.router.router_breakers import RouterView, Tried

log = logging.getLogger(__name__)

Body = dict[str, Any]
PostEvent = Callable[[Mapping[str, Any], Event], Awaitable[None]]
RouterKey = Callable[[Mapping[str, Any]], "str | None"]  # a router pod -> the control-plane key it started with
GRACE_S = 5.0  # how long the router's own discovery gets to add a newly Ready engine before the operator does
RESET_WAIT_S = 3.0  # how long a reset waits for the router to drop a worker before it adds it again


def _serving(pod: Body) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and bool(status.get("podIP")) and \
        not pod["metadata"].get("deletionTimestamp")


class RouterMembership:
    def __init__(self, *, routers: EngineClient, key: RouterKey, post_event: PostEvent | None = None,
                 grace_s: float = GRACE_S, clock: Callable[[], float] = time.monotonic,
                 poke: Callable[[PoolKey], None] | None = None) -> None:
        self._routers = routers  # not ours to close: the operator's one client, shared
        self._key = key
        self._post_event = post_event
        self._grace = grace_s
        self._clock = clock
        self._poke = poke  # the pool's status says what its routers can route to: reconcile it when that changes
        # What each router lacks or has too much, since when: by pool, then by router pod uid. Per pool, because
        # each pool's poll sees only its own routers and must never forget another pool's.
        self._missing: dict[PoolKey, dict[str, Mapping[str, float]]] = {}
        self._unwanted: dict[PoolKey, dict[str, Mapping[str, float]]] = {}
        self._views: dict[PoolKey, dict[str, RouterView]] = {}  # what each router can route to, by pod name
        self._fault: dict[PoolKey, tuple[float, str]] = {}  # the pool's last fault: when, and what it was
        # Each worker's circuit resets in a row, by pool, then by router pod uid, then by worker URL (their backoff).
        self._tried: dict[PoolKey, dict[str, dict[str, Tried]]] = {}

    def forget(self, key: PoolKey) -> None:
        """The pool is gone (or no longer this operator's): its routers' memory and gauges go with it."""
        self._missing.pop(key, None)
        self._unwanted.pop(key, None)
        self._fault.pop(key, None)
        self._tried.pop(key, None)
        self._set_views(key, {})

    def views(self, key: PoolKey) -> Mapping[str, RouterView]:
        """What each router pod of the pool could route to at the last poll, by pod name."""
        return self._views.get(key, {})

    async def sync(self, key: PoolKey, spec: InferencePoolSpec, observed: Observed,
                   health: Mapping[str, GroupHealth]) -> None:
        routers = [p for p in observed.routers if _serving(p)]
        if not routers or observed.pool is None:
            log.debug("no serving router of %s/%s (%d known)", *key, len(observed.routers))
            self._missing.pop(key, None)
            self._unwanted.pop(key, None)
            self._tried.pop(key, None)
            self._set_views(key, {})
            return
        missing = self._missing.setdefault(key, {})
        unwanted = self._unwanted.setdefault(key, {})
        tried = self._tried.setdefault(key, {})
        wanted, left_out = router_membership.in_rotation(spec, observed.of_kind("Pod"),
                                                         {n: h.verdict for n, h in health.items()})
        fault = self._recent_fault(key, spec, left_out)
        views: dict[str, RouterView] = {}
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
            if await self._apply(observed.pool, router, port, key_, changes):
                registered = await self._routers.workers(router, port, key_) or registered
            if spec.router.circuit_breaker.enabled:
                views[router["metadata"]["name"]], tried[uid] = await self._breakers(
                    observed.pool, router, port, key_, registered, wanted, fault, tried.get(uid, {}))
            else:  # no breakers: what it lists is what it can route to
                views[router["metadata"]["name"]] = router_breakers.view(router["metadata"]["name"], registered, {},
                                                                        wanted)
        self._set_views(key, views)
        alive = {r["metadata"].get("uid", "") for r in routers}
        for uid in [u for u in {*missing, *tried} if u not in alive]:
            missing.pop(uid, None)
            unwanted.pop(uid, None)
            tried.pop(uid, None)

    def _recent_fault(self, key: PoolKey, spec: InferencePoolSpec, left_out: Mapping[str, str]) -> str | None:
        """What went wrong in the pool within the breaker window: a group sick, or leaving (restarted, replaced)."""
        now = self._clock()
        faults = sorted({reason for reason in left_out.values()
                         if reason in {str(v) for v in router_membership.SICK} | {router_membership.TERMINATING}})
        if faults:
            self._fault[key] = (now, "an engine group " + " and ".join(
                "being replaced" if f == router_membership.TERMINATING else f"in {f}" for f in faults))
        at, what = self._fault.get(key, (float("-inf"), ""))
        window = parse_duration(spec.router.circuit_breaker.window).total_seconds()
        return what if now - at <= window else None

    async def _breakers(self, pool: Body, router_pod: Body, port: int, key: str | None,
                        registered: list[router_membership.Registered],
                        wanted: Mapping[str, router_membership.Worker], fault: str | None,
                        tried: Mapping[str, Tried]) -> tuple[RouterView, dict[str, Tried]]:
        """The router's view, after resetting the circuits `router_breakers.resets` names and their backoff allows,
        and the router's resets in a row after those."""
        name = router_pod["metadata"]["name"]
        states = await self._routers.circuit_states(router_pod)
        seen = router_breakers.view(name, registered, states or {}, wanted)
        now = self._clock()
        wanted_resets = router_breakers.resets(seen, registered, wanted, fault=fault)
        resets = router_breakers.due(wanted_resets, tried, now)
        if len(resets) < len(wanted_resets):
            log.debug("router %s: circuit resets backing off for %s", name,
                      sorted({r.worker.url for r in wanted_resets} - {r.worker.url for r in resets}))
        if not resets:
            return seen, router_breakers.remember(tried, seen, (), now)
        done = [r for r in resets if await self._reset(router_pod, port, key, r.worker, wanted[r.worker.url])]
        tried = router_breakers.remember(tried, seen, done, now)
        if done:
            meta = pool["metadata"]
            for reset in done:
                metrics.ROUTER_CIRCUIT_RESETS.labels(reason=reset.cause).inc()
            log.warning("router %s: reset the circuits of %s", name, ", ".join(r.worker.url for r in done),
                        extra={"namespace": meta["namespace"], "pool": meta["name"], "router": name})
            reasons = sorted({r.reason for r in done})
            await self._event(pool, Event("Warning", "RouterCircuitsReset", (
                f"router {name} had open circuits for {len(done)} worker(s) the operator judges healthy "
                f"({', '.join(f'{r.worker.worker_type} {r.worker.url}' for r in done)}): "
                f"{'; '.join(reasons)}; re-registered them")))
        after = await self._routers.workers(router_pod, port, key)
        states = await self._routers.circuit_states(router_pod)
        return (router_breakers.view(name, after, states or {}, wanted) if after is not None else seen), tried

    async def _reset(self, router_pod: Body, port: int, key: str | None, registered: router_membership.Registered,
                     worker: router_membership.Worker) -> bool:
        """Re-registers `worker`: removed, then (once the router has dropped it) added again."""
        if not await self._routers.remove_worker(router_pod, port, key, registered):
            return False
        deadline = self._clock() + RESET_WAIT_S
        while self._clock() < deadline:
            listed = await self._routers.workers(router_pod, port, key)
            if listed is not None and all(w.url != worker.url for w in listed):
                break
            await asyncio.sleep(0.1)
        return await self._routers.add_worker(router_pod, port, key, worker)

    def _set_views(self, key: PoolKey, views: dict[str, RouterView]) -> None:
        namespace, pool = key
        for name in set(self._views.get(key, {})) - set(views):
            for role in router_breakers.ROLES:
                with contextlib.suppress(KeyError):
                    metrics.ROUTER_AVAILABLE_WORKERS.remove(namespace, pool, name, role)
        for name, seen in views.items():
            for role in router_breakers.ROLES:
                metrics.ROUTER_AVAILABLE_WORKERS.labels(namespace, pool, name, role).set(seen.available.get(role, 0))
        changed = views != self._views.get(key, {})
        if views:
            self._views[key] = views
        else:
            self._views.pop(key, None)
        if changed and self._poke is not None:
            self._poke(key)

    async def _apply(self, pool: Body, router_pod: Body, port: int, key: str | None,
                     changes: router_membership.Changes) -> bool:
        """Makes `changes`; whether the router took any."""
        took = False
        router = router_pod["metadata"]["name"]
        meta = pool["metadata"]
        where = {"namespace": meta["namespace"], "pool": meta["name"], "router": router}
        for removal in changes.remove:
            if not await self._routers.remove_worker(router_pod, port, key, removal.worker):
                continue
            took = True
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
            took = True
            metrics.ROUTER_WORKER_CHANGES.labels(action="add", reason="in rotation").inc()
            log.info("router %s: added worker %s of group %s", router, worker.url, worker.group, extra=where)
            await self._event(pool, Event("Normal", "RouterWorkerAdded",
                                          f"router {router} sends requests to {worker.role} group {worker.group} "
                                          f"({worker.url}) again"))
        return took

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
