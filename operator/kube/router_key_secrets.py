"""The pools' router-key Secrets: made, rotated and pruned as `planning.router.router_keys` decides, and the key each
router pod takes, for the operator's calls to it.

The operator reads its Secrets by name (RBAC: secrets get/create/patch, no list or watch, so it can read no
Secret it is not told the name of) and keeps what it read or wrote in memory; it reads again after
`REFRESH_S`, so a Secret deleted or edited by hand is healed. No key value is ever logged.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pdfleet.operator.kube import api_paths
from pdfleet.operator.kube.kube_client import KubeClient, KubeError
from pdfleet.operator.planning import ownership
from pdfleet.operator.planning.router import router_keys
from pdfleet.operator.planning.router.router_keys import KeySet
from pdfleet.operator.render import labels, router_secret
from pdfleet.operator.render.context import RenderContext

log = logging.getLogger(__name__)

Body = dict[str, Any]
REFRESH_S = 60.0
KEY_BYTES = 32


def new_key() -> str:
    return secrets.token_urlsafe(KEY_BYTES)


class RouterKeys:
    def __init__(self, client: KubeClient, *, new_key: Callable[[], str] = new_key,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._new_key = new_key
        self._clock = clock
        self._known: dict[tuple[str, str], tuple[KeySet, float]] = {}  # (namespace, pool) -> keys, read at

    def forget(self, namespace: str, pool: str) -> None:
        self._known.pop((namespace, pool), None)

    async def ensure(self, pool: Mapping[str, Any], routers: Sequence[Body]) -> tuple[KeySet, bool]:
        """The pool's keys after making, rotating or pruning them as needed; True when a rotation began."""
        wanted, rotated, write = await self.prepare(pool, routers)
        if write is not None:
            await write()
        return wanted, rotated

    async def prepare(self, pool: Mapping[str, Any], routers: Sequence[Body]) \
            -> tuple[KeySet, bool, Callable[[], Awaitable[None]] | None]:
        """The pool's keys as they should be (what the router Deployment is rendered with: the current key's
        name), True when a rotation began, and the write that makes the Secret hold them (None when it does
        already). Nothing that refers to the keys (the router Deployment) may be written before that write
        succeeded; the rest of a reconcile need not wait for it.

        A pool nothing was said of yet (no status) whose keys this process never held has no Secret, unless an
        operator stopped between writing it and the pool's first status. Its Secret is read inside the write, so
        that its engine pods do not wait a read's round trip: the keys returned are the name a pool without a
        Secret gets; a Secret found there is kept (its key may be in router pods already) and, if its current key
        has another name, the write fails with a conflict after remembering it, so that the Deployment is not
        written with the wrong name and the retry renders the right one."""
        meta = pool["metadata"]
        where = (meta["namespace"], meta["name"])
        held = self._known.get(where)
        referenced = {k for p in routers if (k := router_secret.referenced_key(p, meta["name"]))}
        rotate = str((meta.get("annotations") or {}).get(router_keys.ROTATE_ANNOTATION, ""))
        if held is None and (pool.get("status") or {}).get("observedGeneration") is None:
            named, _ = router_keys.decide(None, rotate=rotate, referenced=referenced, new_key=lambda: "")

            async def read_then_write() -> None:
                current = router_keys.recovered(await self._read(pool), None, referenced)
                wanted, rotated = router_keys.decide(current, rotate=rotate, referenced=referenced,
                                                     new_key=self._new_key)
                if wanted != current:
                    await self._write(pool, wanted, rotated)
                self._known[where] = (wanted, self._clock())
                if wanted.current != named.current:
                    raise KubeError(409, "Conflict", f"the router-key Secret of {where[0]}/{where[1]} names its "
                                                     f"current key {wanted.current}, not {named.current}")

            return named, False, read_then_write
        if held and self._clock() - held[1] < REFRESH_S:
            current: KeySet | None = held[0]
        else:
            current = router_keys.recovered(await self._read(pool), held[0] if held else None, referenced)
        wanted, rotated = router_keys.decide(current, rotate=rotate, referenced=referenced, new_key=self._new_key)
        if wanted == current:
            self._known[where] = (wanted, self._clock())
            return wanted, rotated, None
        return wanted, rotated, lambda: self._write(pool, wanted, rotated)

    async def _write(self, pool: Mapping[str, Any], wanted: KeySet, rotated: bool) -> None:
        meta = pool["metadata"]
        where = (meta["namespace"], meta["name"])
        owner = RenderContext.of(dict(pool)).owner_reference()
        await self._client.apply(router_secret.secret(meta["name"], meta["namespace"], owner, keys=wanted.keys,
                                                      current=wanted.current, handled=wanted.handled))
        log.info("router keys of %s/%s: current %s, holding %s%s", *where, wanted.current,
                 ", ".join(sorted(wanted.keys)), " (rotated)" if rotated else "",
                 extra={"pool": meta["name"], "namespace": meta["namespace"]})
        self._known[where] = (wanted, self._clock())

    def for_pod(self, pod: Mapping[str, Any]) -> str | None:
        """The key a router pod started with, if the operator holds it."""
        meta = pod.get("metadata") or {}
        pool = (meta.get("labels") or {}).get(labels.POOL, "")
        held = self._known.get((meta.get("namespace", ""), pool))
        return held[0].value(router_secret.referenced_key(pod, pool)) if held else None

    def vouched(self, namespace: str, pool: str) -> bool:
        """Whether this process has read the pool's Secret as the pool's, or written it: if not, the executor reads
        it with the pool's other objects before any write (`planning.ownership`)."""
        return (namespace, pool) in self._known

    async def _read(self, pool: Mapping[str, Any]) -> KeySet | None:
        """The keys of the pool's Secret (None: there is none). A Secret of that name the pool does not control is
        not the pool's to read keys from nor to write: `ownership.Blocked`."""
        meta = pool["metadata"]
        name = router_secret.secret_name(meta["name"])
        try:
            found = await self._client.request("GET", api_paths.path_for("v1", "Secret", meta["namespace"], name))
        except KubeError as e:
            if e.not_found:
                return None
            raise
        wanted = [router_secret.reference(meta["name"])]
        if blocked := ownership.blockers(meta.get("uid", ""), meta["namespace"], wanted, {("Secret", name): found}):
            raise ownership.Blocked(blocked)
        return router_keys.parse(found)
