"""kopf handlers: wiring only.

Watch events feed the cache and poke the work queue; workers reconcile one pool at a time from the cache
(`controller.Controller`). No handler decides anything or writes to the cluster itself, so kopf persists
nothing on the pools (no progress annotations, no finalizers) and a resync with nothing changed writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from pdfleet.operator import controller as controller_mod
from pdfleet.operator.kube import client as kube_client
from pdfleet.operator.kube import resources
from pdfleet.operator.render import labels
from pdfleet.operator.runtime_state import OperatorState

log = logging.getLogger(__name__)

MANAGED = {labels.MANAGED_BY: labels.MANAGER}


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


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState = memo["state"]
    # Anything kopf itself stores lives under pdfleet's own group.
    settings.persistence.finalizer = f"{resources.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=resources.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=resources.GROUP)
    settings.posting.level = logging.WARNING  # kopf's own events only for problems; ours are explicit
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.inactivity_timeout = 600  # a stalled watch stream is restarted, not trusted forever
    settings.networking.request_timeout = 60
    cfg = await kube_client.load_configuration(state.options.kubeconfig)
    state.client = kube_client.KubeClient(cfg)
    state.controller = controller_mod.Controller(client=state.client, cache=state.cache)
    for _i in range(state.options.workers):
        state.tasks.append(asyncio.create_task(state.queue.run_worker(state.controller.reconcile)))
    state.tasks.append(asyncio.create_task(_resync(state)))
    state.ready.set()


async def _resync(state: OperatorState) -> None:
    """Level-based safety net: every pool is reconciled periodically even when no event arrives."""
    while True:
        await asyncio.sleep(state.options.resync_period)
        for key in state.cache.pool_keys():
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
    if state.client:
        await state.client.close()


@kopf.on.event(resources.GROUP, resources.VERSION, "inferencepools")
async def pool_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState = memo["state"]
    key = state.cache.record_pool(event["type"], event["object"])
    state.ready.set()
    if event["type"] == "DELETED":
        state.queue.forget(key)
        if state.controller:
            state.controller.forget(key)
    else:
        state.queue.add(key)


async def _owned_event(api_version: str, kind: str, event: kopf.RawEvent, memo: kopf.Memo) -> None:
    state: OperatorState = memo["state"]
    key = state.cache.record_owned(api_version, kind, event["type"], event["object"])
    if key is not None:
        state.queue.add(key)


@kopf.on.event("", "v1", "pods", labels=MANAGED)
async def pod_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    await _owned_event("v1", "Pod", event, memo)


@kopf.on.event("", "v1", "services", labels=MANAGED)
async def service_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    await _owned_event("v1", "Service", event, memo)


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
async def deployment_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    await _owned_event("apps/v1", "Deployment", event, memo)


@kopf.on.event("", "v1", "serviceaccounts", labels=MANAGED)
async def serviceaccount_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    await _owned_event("v1", "ServiceAccount", event, memo)


@kopf.on.event("rbac.authorization.k8s.io", "v1", "roles", labels=MANAGED)
async def role_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    await _owned_event("rbac.authorization.k8s.io/v1", "Role", event, memo)


@kopf.on.event("rbac.authorization.k8s.io", "v1", "rolebindings", labels=MANAGED)
async def rolebinding_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    await _owned_event("rbac.authorization.k8s.io/v1", "RoleBinding", event, memo)
