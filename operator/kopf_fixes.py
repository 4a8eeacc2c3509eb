"""Two fixes to kopf (1.45) the operator installs before kopf starts. Both are about a watch of one namespace
that kopf ends because the namespace is going (`--namespace team-*`: kopf watches each matching namespace
apart, and stops when it judges one deleted).

1. A watch ended before the operator's first indexing finished must not keep that indexing from ever
   finishing. Until every watched kind's first listing, and every object seen in it, is indexed, kopf runs no
   handler: each listing and each object holds a toggle of `operator_indexed`, dropped once listed or
   processed. A watch ended early (its namespace deleted while the operator starts) is cancelled with its
   object workers, and kopf drops neither toggle, so the operator waits forever, handling nothing, while it
   looks alive. Seen in this repository's tests: an operator started 3 s before the previous test's namespace
   was gone never reconciled a pool in 6 minutes. Here each watcher and worker drops its toggle when it ends,
   whatever ended it: an object of a namespace that is gone has nothing left to index.

2. The objects a namespace's ended watch knew are deleted for the operator. kopf stops watching a namespace at
   the namespace controller's first status write of its deletion, often long before the namespace's objects
   are removed (20 s in this repository's CI: engine pods draining first), and it neither discards their
   index entries nor calls any handler for them. The operator then kept such a pool in its cache for good and
   reconciled it every resync, each time writing a status the API refused (409, then 404 once the pool was
   gone) and logging a warning. Here, when kopf ends a watch because its namespace left the watched set, each
   object that watch had processed and not seen deleted goes through kopf's own processing once more as a
   DELETED event: its index entries go, its memory goes, and the operator's handlers forget it, as they do
   for an object deleted under a live watch. A watch ended for any other reason (the operator stopping) is not
   touched.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from kopf._core.reactor import orchestration, queueing

from pdfleet.operator import kopf_support

log = logging.getLogger(__name__)

_INSTALLED = "_pdfleet_fixed"

# The watch tasks kopf is ending because their namespace left the watched set (set just before kopf cancels them).
_NAMESPACE_GONE: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


async def _drop_toggle(kwargs: Mapping[str, Any]) -> None:
    indexed, toggle = kwargs.get("operator_indexed"), kwargs.get("resource_indexed")
    if indexed is not None and toggle is not None:
        # Shielded: a second cancellation must not leave the toggle behind either.
        await asyncio.shield(asyncio.ensure_future(indexed.drop_toggle(toggle)))


def _worker(run: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    @functools.wraps(run)
    async def wrapped(*args: Any, **kwargs: Any) -> None:
        try:
            await run(*args, **kwargs)
        finally:
            await _drop_toggle(kwargs)

    setattr(wrapped, _INSTALLED, True)
    return wrapped


def _watcher(run: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    @functools.wraps(run)
    async def wrapped(*args: Any, **kwargs: Any) -> None:
        processor = kwargs["processor"]
        known: dict[str, Mapping[str, Any]] = {}  # uid -> the last body processed, while not deleted
        if kwargs.get("namespace") is not None:  # a cluster-wide watch has no namespace to leave
            kwargs["processor"] = _recording(processor, known)
        try:
            await run(*args, **kwargs)
        finally:
            await _drop_toggle(kwargs)
            if known and asyncio.current_task() in _NAMESPACE_GONE:
                # The watch's workers are closed by now: nothing else processes these objects.
                await asyncio.shield(asyncio.ensure_future(
                    _deleted(processor, kwargs.get("resource"), kwargs.get("namespace"), list(known.values()))))

    setattr(wrapped, _INSTALLED, True)
    return wrapped


def _recording(processor: Callable[..., Awaitable[str | None]],
               known: dict[str, Mapping[str, Any]]) -> Callable[..., Awaitable[str | None]]:
    """`processor`, keeping in `known` the last body of each object it processed and has not seen deleted."""
    async def recording(*, raw_event: Mapping[str, Any], **rest: Any) -> str | None:
        body = raw_event.get("object") or {}
        uid = (body.get("metadata") or {}).get("uid")
        if uid:
            if raw_event.get("type") == "DELETED":
                known.pop(uid, None)
            else:
                known[uid] = body
        return await processor(raw_event=raw_event, **rest)

    return recording


async def _deleted(processor: Callable[..., Awaitable[Any]], resource: Any, namespace: str | None,
                   bodies: list[Mapping[str, Any]]) -> None:
    log.info("namespace %s is no longer watched (it is being deleted): %d %s known in it are forgotten as deleted",
             namespace, len(bodies), getattr(resource, "plural", resource), extra={"namespace": namespace})
    for body in bodies:
        try:
            await processor(raw_event={"type": "DELETED", "object": body}, stream_pressure=None,
                            resource_indexed=None, operator_indexed=None, consistency_time=None)
        except Exception:  # one object's handler failing must not keep the others in the cache
            log.exception("forgetting %s of namespace %s failed", getattr(resource, "plural", resource), namespace)


def _terminator(run: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    @functools.wraps(run)
    async def wrapped(*, remaining_resources: Collection[Any], remaining_namespaces: Collection[Any],
                      ensemble: orchestration.Ensemble) -> None:
        for key, task in ensemble.watcher_tasks.items():
            if key.namespace is not None and key.namespace not in remaining_namespaces:
                _NAMESPACE_GONE.add(task)
        await run(remaining_resources=remaining_resources, remaining_namespaces=remaining_namespaces,
                  ensemble=ensemble)

    setattr(wrapped, _INSTALLED, True)
    return wrapped


def install() -> None:
    """Wraps kopf's watcher, per-object worker and the orchestrator's terminate_redundancies (each looked up by
    name when it is called); idempotent. Installs nothing, and raises kopf_support.UnsupportedKopf, on a kopf
    these fixes were not written for (another version, or any of the functions they rely on changed)."""
    kopf_support.require()
    for module, name, fix in ((queueing, "watcher", _watcher), (queueing, "worker", _worker),
                              (orchestration, "terminate_redundancies", _terminator)):
        run = getattr(module, name)
        if not getattr(run, _INSTALLED, False):
            setattr(module, name, fix(run))
