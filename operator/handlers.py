"""kopf handlers: wiring only.

Watch events feed the cache and poke the work queue; workers reconcile one pool at a time from the cache
(`controller.Controller`). No handler decides anything or writes to the cluster itself, so kopf persists
nothing on the pools (no progress annotations, no finalizers) and a resync with nothing changed writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from pdfleet.operator import cache as cache_mod
from pdfleet.operator import controller as controller_mod
from pdfleet.operator.api import meta as api_meta
from pdfleet.operator.api import role_scale
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.autoscaler import Autoscaler
from pdfleet.operator.cache import PoolKey
from pdfleet.operator.engines import engine_client, membership, monitor
from pdfleet.operator.kube import kube_client
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.renders import Renders
from pdfleet.operator.planning.scale import gang_wait
from pdfleet.operator.render import labels
from pdfleet.operator.render.router_objects import COMPONENT as ROUTER_COMPONENT
from pdfleet.operator.role_scaler import RoleScaler
from pdfleet.operator.runtime_state import OperatorState

log = logging.getLogger(__name__)

MANAGED = {labels.MANAGED_BY: labels.MANAGER}
GC_YOUNG_THRESHOLD = 20_000  # allocations between collections of the youngest generation (Python's default: 700)


@kopf.on.login()
async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf reaches the API with the same credentials as the operator's own client."""
    state: OperatorState = memo["state"]
    cfg = await kube_client.load_configuration(state.options.kubeconfig)
    token = (cfg.api_key or {}).get("BearerToken") or (cfg.api_key or {}).get("authorization")
    if token and token.lower().startswith("bearer "):
        token = token[len("bearer "):]
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        token=token,
        scheme="Bearer" if token else None,
        insecure=not cfg.verify_ssl,
    )


class NoDiffBase(kopf.DiffBaseStorage):
    """pdfleet registers no change handlers (on.create, on.update, on.resume), so kopf never diffs an object
    against a stored base; its default storage still deep-copied every object of every watch event to build one
    (a tenth of the operator's CPU in a burst of new pools). This one builds nothing and stores nothing."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def _tune_gc() -> None:
    """The operator allocates a burst of short-lived dicts per watch event (their references free them; they
    hold no cycles) next to a large, long-lived heap: modules, kopf's indices. With the default thresholds a
    burst of 40 new pools ran 13 full collections of up to 350 ms each, stalling every request in flight.
    What exists at startup is frozen out of collections, and the youngest generation is collected less often."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    state: OperatorState = memo["state"]
    _tune_gc()
    # kopf hands every index to activity handlers by its id; they fill up as the watches list.
    state.cache = cache_mod.Cache(pools=kwargs["pool_index"],
                                  owned=[kwargs[f"owned_{plural}"] for _, _, plural, _ in OWNED_KINDS],
                                  routers=kwargs["router_pods"])
    # Anything kopf itself stores lives under pdfleet's own group.
    settings.persistence.finalizer = f"{api_meta.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api_meta.GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = logging.WARNING  # kopf's own events only for problems; ours are explicit
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.inactivity_timeout = 600  # a stalled watch stream is restarted, not trusted forever
    settings.networking.request_timeout = 60
    cfg = await kube_client.load_configuration(state.options.kubeconfig)
    state.client = kube_client.KubeClient(cfg)
    # One door to engines and routers: health polls, evidence, verification, canaries, probes and router writes.
    state.engines = engine_client.EngineClient()
    # What reconciles and health polls derive from each pool's spec and status, derived once for both.
    renders = Renders()
    state.health = monitor.HealthMonitor(cache=state.cache, engines=state.engines,
                                         poke=lambda key: _poke_known(state, key), renders=renders)
    state.controller = controller_mod.Controller(client=state.client, cache=state.cache,
                                                 settings=state.options.render,
                                                 health=state.health.health, agents=state.engines,
                                                 requeue=state.queue.add_after, engines=state.health.facts,
                                                 work=state.health.work,
                                                 background_events=True, renders=renders,
                                                 status_pause=controller_mod.STATUS_PAUSE,
                                                 routers=lambda key: state.membership.views(key)
                                                 if state.membership is not None else {})
    # Routers follow what the operator judged: sick, terminating or stale engines leave their rotation.
    state.membership = membership.RouterMembership(routers=state.engines,
                                                   key=state.controller.router_keys.for_pod,
                                                   post_event=state.controller.post_event,
                                                   poke=lambda key: _poke_known(state, key))
    # pdfleet's own autoscaler (spec.autoscaling) reads the load the same poll read, and writes the replicas.
    state.autoscaler = Autoscaler(client=state.client, loads=state.health.loads,
                                  post_event=state.controller.post_event, renders=renders)
    state.health.after_poll = _after_poll(state.membership.sync, state.autoscaler.after_poll)
    pools = kwargs["pool_index"]
    state.role_scaler = RoleScaler(client=state.client, pool=lambda key: next(iter(pools.get(key, ())), None),
                                   objects=kwargs["role_objects"])
    for _i in range(state.options.workers):
        state.tasks.append(asyncio.create_task(state.queue.run_detaching_worker(
            state.controller.reconcile_detaching)))
    state.tasks.append(asyncio.create_task(_resync(state)))
    state.ready.set()


def _after_poll(*steps: monitor.AfterPoll) -> monitor.AfterPoll:
    """Each step after a health poll, in order; one that fails does not keep the next from running."""

    async def run(key: PoolKey, spec: InferencePoolSpec, observed: cache_mod.Observed,
                  judged: Mapping[str, GroupHealth]) -> None:
        for step in steps:
            try:
                await step(key, spec, observed, judged)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("after the health poll of %s/%s", *key)

    return run


def _poke_known(state: OperatorState, key: PoolKey) -> None:
    """A verdict changed: reconcile the pool now (if its event handler has run; see `_resync`)."""
    if key in state.seen:
        state.queue.add(key)


async def _resync(state: OperatorState) -> None:
    """Level-based safety net: every pool is reconciled periodically even when no event arrives. Only pools
    whose event handler has run are resynced: before that, kopf may still be listing what they own."""
    while True:
        await asyncio.sleep(state.options.resync_period)
        for key in state.cache.pool_keys():
            if key in state.seen:
                state.queue.add(key)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState = memo["state"]
    for task in state.tasks:
        task.cancel()
    for task in state.tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    state.queue.close()
    if state.health:
        await state.health.close()
    if state.controller:
        await state.controller.drain(timeout=5)  # the last reconciles' Events, before the client closes
    if state.engines:
        await state.engines.close()
    if state.client:
        await state.client.close()


# Indices: kopf's in-memory caches, which `cache.Cache` reads. kopf fills every index from its initial listing
# before it runs any event handler, so the first reconcile of a pool sees everything the pool owns.
OWNED_KINDS = (
    ("", "v1", "pods", "Pod"),
    ("", "v1", "services", "Service"),
    ("", "v1", "serviceaccounts", "ServiceAccount"),
    ("", "v1", "configmaps", "ConfigMap"),  # evidence of sick groups (`planning.health.restarts`)
    ("apps", "v1", "deployments", "Deployment"),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),  # the routers'
)


# Index functions are coroutines although they never await: kopf runs a plain function in a thread pool, and a
# burst of new pools is thousands of watch events, each then paying a thread hand-off for a dictionary copy.
@kopf.index(api_meta.GROUP, api_meta.VERSION, api_meta.PLURAL)
async def pool_index(body: kopf.Body, **_: Any) -> dict[PoolKey, Any]:
    return cache_mod.pool_entry(body)


def _register_owned(group: str, version: str, plural: str, kind: str) -> None:
    api_version = f"{group}/{version}" if group else version

    async def index(body: kopf.Body, **_: Any) -> dict[PoolKey, Any] | None:
        return cache_mod.owned_entry(api_version, kind, body)

    async def on_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        pool = cache_mod.owning_pool(event["object"].get("metadata", {}))
        pod = kind == "Pod"
        if pod and event["type"] == "DELETED" and gang_wait.stranded_with_its_namespace(event["object"]):
            state: OperatorState = memo["state"]
            if state.controller is not None:  # its namespace is going and no reconcile will see the pod again
                await state.controller.release_stranded([event["object"]])
            return
        if pool:
            memo["state"].poke_soon((event["object"]["metadata"]["namespace"], pool),
                                    health=pod and _pod_news_for_health(event),
                                    stranded=pod and bool(gang_wait.stranded([event["object"]])))

    kopf.index(group, version, plural, labels=MANAGED, id=f"owned_{plural}")(index)
    kopf.on.event(group, version, plural, labels=MANAGED, id=f"{plural}_event")(on_event)


def _pod_news_for_health(event: kopf.RawEvent) -> bool:
    """Whether a pod's event can change what the health monitor judges now: the pod has an address to ask (its
    agent answers only there), is going or is gone. The events before a pod has an IP (created, scheduled) and
    every other kind's events poll nothing that could answer; each poll asks every agent of the pool."""
    pod = event["object"]
    return event["type"] == "DELETED" or bool((pod.get("status") or {}).get("podIP")) or \
        bool((pod.get("metadata") or {}).get("deletionTimestamp"))


for _group, _version, _plural, _kind in OWNED_KINDS:
    _register_owned(_group, _version, _plural, _kind)


@kopf.index("", "v1", "pods", labels={**MANAGED, labels.COMPONENT: ROUTER_COMPONENT})
async def router_pods(body: kopf.Body, **_: Any) -> dict[PoolKey, Any] | None:
    return cache_mod.router_entry(body)


@kopf.on.event(api_meta.GROUP, api_meta.VERSION, api_meta.PLURAL)
async def pool_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState = memo["state"]
    meta = event["object"]["metadata"]
    key = (meta["namespace"], meta["name"])
    if event["type"] == "DELETED":
        state.forget(key)
        return
    urgent = cache_mod.spec_unhandled(event["object"])
    rv = meta.get("resourceVersion")
    if not urgent and key in state.seen and state.unchanged_but_for_autoscaling(key, rv):
        return  # the autoscaler's own status write: the planner only carries status.autoscaling over
    if not urgent and state.controller is not None and state.controller.wrote(key, rv):
        state.echo(key)  # our own status or annotation write: coalesced with what that reconcile wrote
    else:
        state.poke(key, urgent=urgent)


# InferencePoolRoles (`role_scaler`): a pool's roles as scale targets, kept in step with the pool's replicas.
@kopf.index(api_meta.GROUP, api_meta.VERSION, role_scale.PLURAL, labels=MANAGED)
async def role_objects(body: kopf.Body, **_: Any) -> dict[PoolKey, Any] | None:
    return cache_mod.owned_entry(api_meta.API_VERSION, role_scale.KIND, body)


@kopf.on.event(api_meta.GROUP, api_meta.VERSION, role_scale.PLURAL, labels=MANAGED)
async def role_object_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState = memo["state"]
    meta = event["object"]["metadata"]
    pool = cache_mod.owning_pool(meta)
    if pool and state.role_scaler is not None:
        await state.role_scaler.sync((meta["namespace"], pool))


@kopf.on.event(api_meta.GROUP, api_meta.VERSION, api_meta.PLURAL, id="pool_role_scale")
async def pool_role_scale(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState = memo["state"]
    meta = event["object"]["metadata"]
    if event["type"] != "DELETED" and state.role_scaler is not None:
        await state.role_scaler.sync((meta["namespace"], meta["name"]))
