"""The executor: reads one pool's snapshot from the cache, asks the pure planner what to do, and does it.

This is the only place where reconcile decisions turn into API calls, and it makes them in a fixed order:
objects first, then deletions, then status, then events. Nothing here decides *what* to do.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pdfleet.operator import metrics
from pdfleet.operator.cache import Cache, ObjectKey, Observed, PoolKey
from pdfleet.operator.engines import evidence
from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.kube import api_paths, existing, pool_patch
from pdfleet.operator.kube import events as kube_events
from pdfleet.operator.kube.detached import Detached
from pdfleet.operator.kube.kube_client import KubeClient, KubeError
from pdfleet.operator.kube.kueue import WorkloadReasons
from pdfleet.operator.kube.router_key_secrets import RouterKeys
from pdfleet.operator.kube.slots import Slots
from pdfleet.operator.planning import ownership, reconcile, refusals, status_writes
from pdfleet.operator.planning.groups import Expectations
from pdfleet.operator.planning.health import restarts
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.plan import Event, ObjectRef, Plan
from pdfleet.operator.planning.renders import Renders
from pdfleet.operator.planning.rollout.verification import EngineFacts
from pdfleet.operator.planning.router.router_breakers import RouterView
from pdfleet.operator.planning.router.router_keys import KeySet, key_name
from pdfleet.operator.planning.scale import gang_wait
from pdfleet.operator.planning.scale.engine_load import Work
from pdfleet.operator.planning.spec_change import SpecChange
from pdfleet.operator.render import gang, router_secret, stamp
from pdfleet.operator.render.context import Settings
from pdfleet.operator.workqueue import Retry

log = logging.getLogger(__name__)


MAX_IN_FLIGHT = 32  # concurrent API writes of one operator, across all pools

EVENTS_IN_FLIGHT = 8  # Events posted at once in the background, across all pools

EXPECTATION_TTL = 60.0  # seconds; a watch that has not shown our write by then never will (client-go: 5 min)

# Seconds between a pool's status writes that only say progress (`status.news`: no phase, condition or revision
# moves; a group Ready, then the next): a new pool's groups become Ready one by one within a second or two, and
# each was a status write, an echo and a reconcile. Anything else is written at once.
STATUS_PAUSE = 1.0


# A pool's phase, its groups' (role, verdict), and why it runs without recommended fixes (optedOut, held), as its
# last status said: what the pools, groups and missing-fixes gauges count.
Summary = tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]]
SUMMARY_GAUGES = (metrics.POOLS, metrics.ENGINE_GROUPS, metrics.POOLS_WITHOUT_RECOMMENDED_PATCHES)


def summary_labels(summary: Summary | None) -> tuple[tuple[tuple[str, ...], ...], ...]:
    """The label sets `summary` counts once each, per gauge of SUMMARY_GAUGES (none for a pool that is gone)."""
    if summary is None:
        return tuple(() for _ in SUMMARY_GAUGES)
    phase, groups, missing = summary
    return ((phase,),), groups, tuple((reason,) for reason in missing)


def summary_of(status: Mapping[str, Any]) -> Summary:
    patches = status.get("patches") or {}
    return (status.get("phase", "Pending"),
            tuple((g.get("role", ""), g.get("verdict", "Unknown")) for g in status.get("groups", [])),
            tuple(reason for reason in ("optedOut", "held") if patches.get(reason)))

_gauges_of: Controller | None = None  # the executor whose pools the gauges count (one per operator process)

# What the operator last judged of a pool's engine groups' ranks, by group name (`engines.monitor`).
HealthView = Callable[[PoolKey], Mapping[str, GroupHealth]]


def _no_health(_: PoolKey) -> Mapping[str, GroupHealth]:
    return {}


# What the operator last saw of a pool's engines for the verification gates, by group name (`engines.monitor`).
EnginesView = Callable[[PoolKey], Mapping[str, EngineFacts]]


def _no_engines(_: PoolKey) -> Mapping[str, EngineFacts]:
    return {}


# What each router pod of a pool could route to at the last health poll, by pod name (`engines.membership`).
RoutersView = Callable[[PoolKey], Mapping[str, RouterView]]


def _no_routers(_: PoolKey) -> Mapping[str, RouterView]:
    return {}


# What the last health poll read of a pool's groups' load, for a scale-down's choice (`engines.monitor`).
WorkView = Callable[[PoolKey], Work]


class Controller:
    def __init__(self, *, client: KubeClient, cache: Cache, settings: Settings | None = None,
                 health: HealthView = _no_health, agents: EngineClient | None = None,
                 requeue: Callable[[PoolKey, float], None] | None = None,
                 engines: EnginesView = _no_engines, background_events: bool = False,
                 router_keys: RouterKeys | None = None, renders: Renders | None = None,
                 status_pause: float = 0.0, work: WorkView | None = None,
                 routers: RoutersView = _no_routers) -> None:
        self._client = client
        self.router_keys = router_keys or RouterKeys(client)
        self._kueue = WorkloadReasons(client)  # why Kueue holds a gang, for the group's status
        self._cache = cache
        self._settings = settings
        self._health = health
        self._engines = engines
        self._routers = routers
        self._work = work  # None: no monitor reads loads, and a scale-down does not wait for them
        self._agents = agents  # evidence before a restart; without agents every pod is noted as not answering
        self._requeue = requeue  # reconcile a pool again after a delay (the work queue's add_after)
        # What this process wrote that the watch may not show yet (client-go's "expectations"): without it, a
        # reconcile that runs before the watch catches up would write the same object again.
        self._applied: dict[PoolKey, dict[ObjectKey, tuple[str, float]]] = {}
        self._deleting: dict[PoolKey, dict[ObjectKey, float]] = {}
        self._in_flight = Slots(MAX_IN_FLIGHT, ranks=len(_RANKS) + 1)
        self._summaries: dict[PoolKey, Summary] = {}
        # Per gauge of SUMMARY_GAUGES, how many pools (groups) count under each label set, as the gauge shows it.
        self._counts: tuple[collections.Counter[tuple[str, ...]], ...] = tuple(
            collections.Counter() for _ in SUMMARY_GAUGES)
        # The pool as our last status write left it, by the resourceVersion it replaced: until the watch shows
        # the write, a reconcile plans from this instead of the stale cached pool (whose status write would be
        # refused with a conflict and retried with backoff, as it was dozens of times in a burst).
        self._written: dict[PoolKey, tuple[str, dict[str, Any]]] = {}
        # What plans derived from each pool's spec and status (validation, every rendered object, the parsed
        # status), reused while they are unchanged: most reconciles see a spec they have seen before.
        # (Shared with the health monitor, whose polls read the same specs and statuses.)
        self._renders = renders if renders is not None else Renders()
        # Progress-only status writes wait until `status_pause` seconds after the pool's last (needs `requeue`).
        self._status_pause = status_pause
        self._status_at: dict[PoolKey, float] = {}
        # background_events: a reconcile's Events are posted after it, so the worker is free for the next pool
        # sooner (in a burst of new pools, a tenth of a first reconcile was waiting for its Events).
        self._events = Detached(EVENTS_IN_FLIGHT) if background_events else None

    def forget(self, key: PoolKey) -> None:
        self._written.pop(key, None)
        self._applied.pop(key, None)
        self._deleting.pop(key, None)
        self._status_at.pop(key, None)
        self._renders.forget(*key)
        self.router_keys.forget(*key)
        self._summarise(key, None)

    async def release_stranded(self, pods: list[Mapping[str, Any]]) -> None:
        """Takes Kueue's finalizer off pods that hold nothing and whose pool is no longer reconciled: those of a
        namespace being deleted, which the operator no longer watches (planning/scale/gang_wait)."""
        await self._kueue.release(pods, gang.FINALIZER)

    def wrote(self, key: PoolKey, resource_version: str | None) -> bool:
        """Whether `resource_version` is the pool as this process's last write of it (status or annotation) left it:
        its watch event is the echo of that write, which the next reconcile covers, not news."""
        written = self._written.get(key)
        return resource_version is not None and written is not None and \
            written[1].get("metadata", {}).get("resourceVersion") == resource_version

    def _record_summary(self, key: PoolKey, status: Mapping[str, Any] | None) -> None:
        """Keeps the summary gauges (pools by phase, groups by verdict, pools without recommended fixes) true to the
        last status of every pool."""
        if not status:
            return
        summary = summary_of(status)
        if self._summaries.get(key) != summary:
            self._summarise(key, summary)

    def _summarise(self, key: PoolKey, summary: Summary | None) -> None:
        """Moves the pool's counts in the summary gauges from its last summary to `summary` (None: the pool is gone),
        setting only the label sets that change and removing one no pool has any more. Rebuilding the gauges from
        every pool's summary at each change cost O(pools) per status change (0.8% of the operator's CPU with 100
        pools, docs/operator-throughput.md), and a scrape in between saw them empty."""
        global _gauges_of
        old = self._summaries.pop(key, None)
        if summary is not None:
            self._summaries[key] = summary
        if _gauges_of is not self:  # another executor of this process (a test's) wrote them last: start over
            old = None
            _gauges_of = self
            for gauge, counts in zip(SUMMARY_GAUGES, self._counts, strict=True):
                counts.clear()
                gauge.clear()
            for other in [s for k, s in self._summaries.items() if k != key]:
                for gauge, counts, labelled in zip(SUMMARY_GAUGES, self._counts, summary_labels(other), strict=True):
                    counts.update(labelled)
                    for labels in labelled:
                        gauge.labels(*labels).set(counts[labels])
        for gauge, counts, before, after in zip(SUMMARY_GAUGES, self._counts, summary_labels(old),
                                                summary_labels(summary), strict=True):
            for labels in before:
                counts[labels] -= 1
            for labels in after:
                counts[labels] += 1
            for labels in {*before, *after}:
                if counts[labels] > 0:
                    gauge.labels(*labels).set(counts[labels])
                else:
                    del counts[labels]
                    with contextlib.suppress(KeyError):
                        gauge.remove(*labels)

    def _expectations(self, key: PoolKey, owned: Mapping[ObjectKey, Mapping[str, Any]]) -> Expectations:
        """Drops what the watch has caught up with, or what is too old to trust, and returns the rest."""
        now = time.monotonic()
        applied = self._applied.setdefault(key, {})
        for obj_key, (digest, at) in list(applied.items()):
            seen = owned.get(obj_key)
            if now - at > EXPECTATION_TTL or (seen is not None and stamp.applied_hash(seen) == digest):
                del applied[obj_key]
        deleting = self._deleting.setdefault(key, {})
        for obj_key, at in list(deleting.items()):
            if now - at > EXPECTATION_TTL or obj_key not in owned:
                del deleting[obj_key]
        return Expectations(applied={k: d for k, (d, _) in applied.items()}, deleting=frozenset(deleting))

    async def reconcile_detaching(self, key: PoolKey) -> Awaitable[None] | None:
        """`reconcile`, handing back its writes once the plan is made (None when it ended before any): the work
        queue's worker takes the next pool meanwhile (WorkQueue.run_detaching_worker) and holds this pool as being
        handled until the writes end. In a burst of new pools a first reconcile's chain of writes took seconds
        (objects, then what depends on them, then the status and Events) while its plan took milliseconds, and the
        workers, not the apiserver, set the pace (docs/operator-throughput.md)."""
        planned = asyncio.Event()
        whole = asyncio.ensure_future(self.reconcile(key, planned=planned))
        plan_made = asyncio.ensure_future(planned.wait())
        try:
            await asyncio.wait({whole, plan_made}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            whole.cancel()
            raise
        finally:
            plan_made.cancel()
        if whole.done():
            whole.result()
            return None
        return whole

    async def reconcile(self, key: PoolKey, *, planned: asyncio.Event | None = None) -> None:
        started = time.perf_counter()
        result = "error"
        try:
            result = await self._reconcile(key, planned)
        except KubeError as e:
            # The API said no (a terminating namespace, a conflict on a stale status, a lost connection):
            # expected in a live cluster, so one line, and a retry with backoff.
            # A conflict only means the pool changed under us; the next reconcile starts from the news.
            level = logging.DEBUG if e.conflict else logging.WARNING
            log.log(level, "reconcile of %s/%s failed, will retry: %s", key[0], key[1], e,
                    extra={"pool": key[1], "namespace": key[0]})
            raise Retry from e
        finally:
            metrics.RECONCILES.labels(result=result).inc()
            metrics.RECONCILE_DURATION.labels(result=result).observe(time.perf_counter() - started)

    async def _reconcile(self, key: PoolKey, on_planned: asyncio.Event | None = None) -> str:
        observed = self._cache.snapshot(key)
        pool = observed.pool
        # Pods deleted before Kueue admitted them (a waiting group replaced, restarted or scaled away): see stranded.
        if stranded := gang_wait.stranded(observed.of_kind("Pod")):
            await self._kueue.release(stranded, gang.FINALIZER)
        if pool is None or pool["metadata"].get("deletionTimestamp"):
            self.forget(key)
            return "deleted"  # owner references let the garbage collector remove everything else
        replaced, stored = self._written.get(key, (None, None))
        if stored is not None and replaced == pool["metadata"].get("resourceVersion"):
            # The watch has not shown our last status write yet: plan from what the write returned.
            observed = dataclasses.replace(observed, pool=stored)
            pool = stored
        else:
            self._written.pop(key, None)  # the watch has caught up (or someone else wrote): the cache is news
        expect = self._expectations(key, observed.owned)
        started = time.perf_counter()
        held: tuple[ownership.Blocker, ...] = ()
        try:
            keys, rotated, write_secret = await self.router_keys.prepare(pool, observed.routers)
        except ownership.Blocked as e:
            # Its Secret is not the pool's: planned all the same (with the name a first key gets), so that the pool
            # names every object that blocks it, not the Secret alone; nothing is written.
            keys, rotated, write_secret, held = KeySet(key_name(1), {}), False, None, e.blockers
        gangs = gang_wait.held_gangs(observed.of_kind("Pod"))
        why = await self._kueue.read(key[0], gangs) if gangs else {}
        plan = reconcile.plan(pool, observed, now=datetime.datetime.now(datetime.UTC), expect=expect,
                              settings=self._settings,
                              health=self._health(key), engines=self._engines(key), router_key=keys.current,
                              renders=self._renders, work=self._work(key) if self._work is not None else None,
                              gang_reasons=why, routers=self._routers(key))
        planned = time.perf_counter()
        if plan.rejected:
            write_secret = None  # a rejected spec (invalid, or refused by the pool policy) makes nothing, its key too
        applied, deleting = self._applied.get(key), self._deleting.get(key)
        if applied is None or deleting is None:
            # Forgotten while this plan was made (the pool deleted, or its namespace going): nothing to write.
            return "deleted"
        if on_planned is not None and not plan.empty:
            on_planned.set()  # what is left is writing: the worker may go on to the next pool
        if blocked := tuple(sorted({*held, *await self._blockers(key, pool, observed, plan, expect,
                                                                write_secret is not None)})):
            return await self._blocked(key, pool, plan, blocked)
        # The router-key Secret goes out with the first objects, not before them: only the router Deployment
        # needs it (its pods take a key by name and must find it when they start), and `apply` holds that back
        # until the Secret is written. A new pool's engine pods no longer wait a request's round trip for it.
        secret = asyncio.ensure_future(write_secret()) if write_secret is not None else None
        if secret is not None:
            secret.add_done_callback(_retrieved)

        failed: set[ObjectKey] = set()
        made: set[ObjectKey] = set()  # writes the API took: what a failed reconcile's Events may report
        # Writes refused for good (refusals.is_refusal) are noted here, not raised: they go into the status.
        refused: list[refusals.Refusal] = []

        def failure(verb: str, kind: str, name: str, e: KubeError) -> KubeError | None:
            failed.add((kind, name))
            if not refusals.is_refusal(e.status):
                return e
            refused.append(refusals.Refusal(verb, kind, name, e.status, e.reason, e.message))
            return None

        async def apply(obj: dict[str, Any]) -> None:
            key_ = (obj["kind"], obj["metadata"]["name"])
            if secret is not None and obj["kind"] in _NEEDS_ROUTER_KEY:
                try:
                    await secret  # raises what the Secret's write raised: the Deployment is then not written
                except ownership.Blocked:
                    raise Refused from None  # said below, as the pool being blocked
            verb = "create" if obj["kind"] in _CREATED else "apply"
            try:
                async with self._in_flight.held(rank=_write_rank(obj["kind"])):
                    await (self._client.create(obj) if verb == "create" else self._client.apply(obj))
            except KubeError as e:
                if (retried := failure(verb, *key_, e)) is not None:
                    raise retried from None
                raise Refused from e
            applied[key_] = (stamp.applied_hash(obj) or "", time.monotonic())
            made.add(key_)

        async def delete(ref: ObjectRef) -> None:
            try:
                async with self._in_flight.held():
                    await self._client.delete(ref.api_version, ref.kind, key[0], ref.name, uid=ref.uid,
                                              grace_period_seconds=ref.grace_period_seconds)
            except KubeError as e:
                if (retried := failure("delete", ref.kind, ref.name, e)) is not None:
                    raise retried from None
                raise Refused from e
            deleting[(ref.kind, ref.name)] = time.monotonic()
            made.add((ref.kind, ref.name))
            applied.pop((ref.kind, ref.name), None)

        # Events are posted for what succeeded even when something failed, then the first failure is raised.
        # Evidence first: nothing of a sick group is restarted in the plan that asks for its evidence.
        error: BaseException | None = None
        for request in plan.capture:
            error = error or await _all(self._capture(pool, observed, request, apply))
        error = error or await _apply_tiers(plan.apply, apply, failed)
        written = time.perf_counter()
        error = error or await _all(*(delete(ref) for ref in plan.delete))
        key_events: tuple[Event, ...] = ()
        if secret is not None:
            try:
                await secret
            except KubeError as e:
                error = error or e
            except ownership.Blocked as e:
                # A Secret of its name made between the read before the writes and the Secret's own read: what
                # went out meanwhile is the pool's; the rest waits, as for a blocker found before the writes.
                return await self._blocked(key, pool, plan, e.blockers)
            else:
                made.add(("Secret", router_secret.secret_name(key[1])))
                if rotated:
                    key_events = (Event("Normal", "RouterKeyRotated",
                                        f"router control-plane key rotated to {keys.current}; the router pods "
                                        f"restart to take it, the old key stays valid until they have",
                                        about=(("Secret", router_secret.secret_name(key[1])),)),)
        for restart in plan.restarted:
            if not failed & set(restart.pods):
                metrics.GROUP_RESTARTS.labels(reason=restart.cause).inc()
        for analysis in plan.analyses:
            metrics.ROLLOUT_ANALYSES.labels(result=analysis.result).inc()
            metrics.ROLLOUT_BAKE_DURATION.labels(result=analysis.result).observe(analysis.seconds)
        status, events = plan.status, key_events + tuple(e for e in plan.events if not failed & set(e.about))
        if refused:
            # Said in the status and by one Warning, in this reconcile: retrying the same write changes nothing.
            status, warning = refusals.refused_status(pool, plan.status, refused, datetime.datetime.now(datetime.UTC))
            events += warning
            log.warning("%s/%s: %s", key[0], key[1], refusals.describe(refused),
                        extra={"pool": key[1], "namespace": key[0]})
        elif error is not None:
            await self._post_events(pool, _acts_done(events, made))
            raise error
        deferred = status is not None and not refused and self._deferred(key, pool, plan)
        if status is not None and not deferred:
            try:
                await self._write_status(pool, status)
            except KubeError:
                await self._post_events(pool, _acts_done(events, made))
                raise
        events = await self._change_pool(key, pool, plan.pool_changes, events)
        if key in self._applied:  # not forgotten since this reconcile began: a pool gone is not counted again
            self._record_summary(key, status if status is not None and not deferred else pool.get("status"))
        await self._post_events(pool, events)
        if error is not None:
            raise error  # what may pass on its own is retried with backoff, refusals or not
        if plan.requeue_after is not None and self._requeue is not None:
            self._requeue(key, plan.requeue_after)  # a restart backoff ends then; no event will say so
        if not plan.empty:
            done = time.perf_counter()
            log.info("reconciled %s/%s: %d applied, %d deleted, status %s in %.0f ms (planning %.0f ms, objects "
                     "%.0f ms)", key[0], key[1], len(plan.apply), len(plan.delete),
                     "deferred" if deferred else "written" if plan.status is not None else "unchanged",
                     1000 * (done - started),
                     1000 * (planned - started), 1000 * (written - planned),
                     extra={"pool": key[1], "namespace": key[0]})
        return "rejected" if plan.rejected else "refused" if refused else "success"

    async def _blockers(self, key: PoolKey, pool: Mapping[str, Any], observed: Observed, plan: Plan,
                        expect: Expectations, secret: bool) -> tuple[ownership.Blocker, ...]:
        """The objects this plan would write (its objects, its evidence ConfigMaps, the router-key Secret when
        `secret`) whose names are taken by objects the pool does not control. What the cache does not vouch for is
        read by name first, ahead of every write: a new pool's first reconcile reads all of its objects once."""
        desired = [*plan.apply, *({"apiVersion": "v1", "kind": "ConfigMap", "metadata": r.metadata}
                                  for r in plan.capture)]
        if secret and not self.router_keys.vouched(*key):
            desired.append(router_secret.reference(key[1]))
        unknown = ownership.unverified(desired, observed.owned, expect.applied)
        read = await existing.read(self._client, key[0], unknown, lambda: self._in_flight.held(rank=0)) \
            if unknown else {}
        return ownership.blockers(pool["metadata"].get("uid", ""), key[0], desired, {**observed.owned, **read})

    async def _blocked(self, key: PoolKey, pool: Mapping[str, Any], plan: Plan | None,
                       blocked: tuple[ownership.Blocker, ...]) -> str:
        """Writes nothing of the pool but its status (`ownership.blocked_status`) and the Events that say what
        the status says (none that report a write: there is none), and looks again after `ownership.RECHECK_S`:
        an unlabelled object, or a Secret, makes no event the operator sees when it goes."""
        status, warning = ownership.blocked_status(pool, plan.status if plan is not None else None, blocked,
                                                   datetime.datetime.now(datetime.UTC))
        log.warning("%s/%s: blocked: %s", key[0], key[1], ", ".join(map(str, blocked)),
                    extra={"pool": key[1], "namespace": key[0]})
        if status is not None:
            await self._write_status(pool, status)
        if key in self._applied:
            self._record_summary(key, status if status is not None else pool.get("status"))
        await self._post_events(pool, tuple(e for e in (plan.events if plan is not None else ()) if not e.about)
                                + warning)
        if self._requeue is not None:
            self._requeue(key, ownership.RECHECK_S)
        return "blocked"

    async def _capture(self, pool: Mapping[str, Any], observed: Observed, request: restarts.EvidenceRequest,
                       apply: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        """Asks the group's agents for evidence and stores it in the ConfigMap the plan named; the next plan
        sees it (or, until the watch shows it, the expectation) and may restart the group."""
        pods = [p for p in observed.of_kind("Pod") if p["metadata"]["name"] in request.pods]
        if self._agents is not None:
            data = await evidence.capture(self._agents, request, pods)
        else:
            data = evidence.data_of(request, [(p["metadata"]["name"], None, None) for p in pods])
        obj = stamp.stamped(evidence.configmap(request, data))
        try:
            await apply(obj)
        except (KubeError, Refused):
            metrics.EVIDENCE_CAPTURES.labels(result="error").inc()
            raise
        metrics.EVIDENCE_CAPTURES.labels(result="captured").inc()
        name = request.metadata["name"]
        await self._post_event(pool, Event("Normal", "EvidenceCaptured",
                                           f"captured evidence of group {request.group} ({request.verdict}) from "
                                           f"{len(pods)} pod(s) before restarting it: ConfigMap {name}"))

    def _deferred(self, key: PoolKey, pool: Mapping[str, Any], plan: Plan) -> bool:
        """Whether the plan's status waits: it only says progress, nothing else is to be done, and the pool's status
        was written less than `status_pause` ago. The pool is then reconciled again when the pause ends, and that
        reconcile writes what is true then."""
        if not self._status_pause or self._requeue is None or plan.status is None or not plan.status_only or \
                status_writes.news(pool.get("status"), plan.status):
            return False
        wait = self._status_at.get(key, -self._status_pause) + self._status_pause - time.monotonic()
        if wait <= 0:
            return False
        self._requeue(key, wait)
        return True

    async def _write_status(self, pool: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        meta = pool["metadata"]
        path = api_paths.object_path(pool) + "/status"
        # A merge patch of the whole status, guarded by the resourceVersion we planned from: a status
        # computed from a stale pool is refused (409) and recomputed, never written over newer news.
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]},
                "status": status_writes.merge_patch(pool.get("status"), status)}
        stored = await self._client.request("PATCH", path, body=body, content_type="application/merge-patch+json")
        self._status_at[(meta["namespace"], meta["name"])] = time.monotonic()
        if isinstance(stored, dict) and stored.get("metadata", {}).get("resourceVersion"):
            self._written[(meta["namespace"], meta["name"])] = (meta["resourceVersion"], stored)

    async def _change_pool(self, key: PoolKey, pool: Mapping[str, Any], changes: tuple[SpecChange, ...],
                           events: tuple[Event, ...]) -> tuple[Event, ...]:
        """The plan's changes to the pool's own object, after its status (whose write is guarded by the planned
        resourceVersion, which they move). One refused for a stale generation is dropped with its Events."""
        for change in changes:
            stored = await pool_patch.patch_pool(self._client, pool, change)
            if stored is None:
                log.info("%s/%s: not changed, its spec moved on: %s", *key, change.why)
                events = tuple(e for e in events if ("InferencePool", key[1]) not in e.about)
                continue
            log.info("%s/%s: %s", *key, change.why, extra={"pool": key[1], "namespace": key[0]})
            self._written[key] = (pool["metadata"].get("resourceVersion", ""), stored)
        return events

    async def _post_events(self, pool: Mapping[str, Any], events: tuple[Event, ...]) -> None:
        """Posts a reconcile's events, in the background when the controller was made so."""
        if self._events is None:
            await _all(*(self._post_event(pool, e) for e in events))
            return
        for event in events:
            self._events.spawn(self._post_event(pool, event))

    async def drain(self, timeout: float | None = None) -> None:
        """Waits for the events still being posted in the background (before the client closes, say)."""
        if self._events is not None:
            await self._events.drain(timeout)

    async def post_event(self, pool: Mapping[str, Any], event: Event) -> None:
        """An event about `pool` from outside a reconcile (the routers' membership, say)."""
        await self._post_event(pool, event)

    async def _post_event(self, pool: Mapping[str, Any], event: Event) -> None:
        body = kube_events.event_body(pool, event)
        try:
            await self._client.create(body)
        except KubeError as e:  # an event is news, not state: losing one must not fail the reconcile
            log.warning("could not post event %s for %s/%s: %s", event.reason, pool["metadata"]["namespace"],
                        pool["metadata"]["name"], e)


# Kinds the planner only ever creates (an engine pod is never changed in place: a changed one is a new group), so
# they are created, not applied. Server-side apply costs the apiserver far more (the managed-fields merge): a pool's
# 18 objects, 30 pools at 2 a second, took 3.6 s applied against 0.6 s created on the loaded local cluster. A pod
# that exists after all is refused (409) and the retry sees it. Kinds that are changed in place stay applied: a
# field created by a plain create belongs to no apply, and a later apply that drops it would leave it behind.
_CREATED = {"Pod"}

# What a reconcile writes only once the router-key Secret holds the key it names (`RouterKeys.prepare`).
_NEEDS_ROUTER_KEY = {"Deployment"}


def _acts_done(events: tuple[Event, ...], made: set[ObjectKey]) -> tuple[Event, ...]:
    """The Events to post when a reconcile fails before its status is written: those reporting writes the API took
    (`about`, all of it in `made`; not a write left undone behind a failed one, nor a change to the pool itself,
    which comes after the status). They are true, and the retry will not make those writes again, so it will not
    say them again. Events that say what the status says (no `about`: PoolReady, Scaled,
    RolloutSurgeUnschedulable...) wait for the retry, which plans them again from the same previous status (posted
    now, the retry would post them again). A replacement's Event was lost when the status write after it was
    refused (409): seen in this suite's runs."""
    return tuple(e for e in events if e.about and set(e.about) <= made)


def _retrieved(task: asyncio.Future[None]) -> None:
    """Marks a background write's failure as seen: the reconcile that started it reports it, or has already
    ended with another error (asyncio would otherwise log 'exception was never retrieved')."""
    if not task.cancelled():
        task.exception()


# What depends on what: a RoleBinding needs its Role (the operator may bind only what exists), and the router's
# Deployment its ServiceAccount and RoleBinding (its pods list pods from the start). Engine pods and Services depend
# on none of these, so they go out in the first wave: they are what a new pool waits for.
_TIER = {"RoleBinding": 1, "Deployment": 2}
_DEPENDED_ON = {"ServiceAccount", "Role", "RoleBinding"}
# The order writes get the operator's write slots in (`_write_rank`), lowest first, each rank in the order it came:
# - NetworkPolicies: a new engine pod should find its policy in place;
# - engine pods: what a new pool waits for longest (minutes of image pull and weight loading on a real fleet);
#   in a burst of new pools they queued behind every pool's Roles, RoleBindings and Deployments;
# - what the later tiers wait for, link by link (a RoleBinding, then the router Deployment), and the router
#   Deployment itself: seconds from write to serving;
# - everything else (Services, PodDisruptionBudgets, evidence ConfigMaps, deletions).
_RANKS: tuple[frozenset[str], ...] = (frozenset({"NetworkPolicy"}), frozenset({"Pod"}),
                                      frozenset(_DEPENDED_ON | set(_TIER)))


def _write_rank(kind: str) -> int:
    return next((rank for rank, kinds in enumerate(_RANKS) if kind in kinds), len(_RANKS))


def _tiers(objects: tuple[dict[str, Any], ...]) -> list[list[dict[str, Any]]]:
    tiers: dict[int, list[dict[str, Any]]] = {}
    for obj in objects:
        tiers.setdefault(_TIER.get(obj["kind"], 0), []).append(obj)
    return [tiers[t] for t in sorted(tiers)]


async def _apply_tiers(objects: tuple[dict[str, Any], ...], apply: Callable[[dict[str, Any]], Awaitable[None]],
                       failed: set[ObjectKey]) -> BaseException | None:
    """Applies every object, a tier only once what the tiers before it hold for it (`_DEPENDED_ON`) is answered,
    and not at all if any of that failed (the retry writes it first). Only those gate: a tier does not wait for
    the engine pods before it, which on a busy apiserver took as long as the rest of a new pool's reconcile."""
    gate: asyncio.Future[None] | None = None
    tiers = []
    for tier in _tiers(objects):
        opened = asyncio.get_running_loop().create_future()
        tiers.append(_apply_tier(tier, gate, opened, apply, failed))
        gate = opened
    errors = await asyncio.gather(*tiers)
    return next((e for e in errors if e is not None), None)


async def _apply_tier(tier: list[dict[str, Any]], gate: asyncio.Future[None] | None, opened: asyncio.Future[None],
                      apply: Callable[[dict[str, Any]], Awaitable[None]],
                      failed: set[ObjectKey]) -> BaseException | None:
    """One tier: waits for `gate`, applies its objects together and opens `opened` for the next tier once
    its depended-on objects are answered (or once it gives up)."""
    try:
        if gate is not None:
            await gate
            if any(kind in _DEPENDED_ON for kind, _ in failed):
                return None
        rest = asyncio.ensure_future(_all(*(apply(o) for o in tier if o["kind"] not in _DEPENDED_ON)))
        try:
            depended_error = await _all(*(apply(o) for o in tier if o["kind"] in _DEPENDED_ON))
            opened.set_result(None)
            rest_error = await rest
            return depended_error or rest_error
        finally:
            if not rest.done():
                rest.cancel()
    finally:
        if not opened.done():
            opened.set_result(None)


class Refused(Exception):
    """A write the apiserver refused for good, already noted for the status: it stops what depended on it (an
    evidence capture's event) but is no failure to retry."""


async def _all(*aws: Awaitable[None]) -> BaseException | None:
    """Runs everything to completion and returns the first failure to retry (or None)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    return next((r for r in results if isinstance(r, BaseException) and not isinstance(r, Refused)), None)
