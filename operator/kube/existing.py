"""Reads, by name, the objects a pool is about to write that the operator's cache cannot vouch for
(`planning.ownership.unverified`): what exists under those names, whoever made it. The cache holds only labelled
objects a pool controls, and no Secret; a GET by name needs no list or watch permission."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pdfleet.operator.kube import api_paths
from pdfleet.operator.kube.kube_client import KubeClient, KubeError

Body = dict[str, Any]
ObjectKey = tuple[str, str]  # (kind, name)


async def read(client: KubeClient, namespace: str, objects: Iterable[Mapping[str, Any]],
               slot: Callable[[], contextlib.AbstractAsyncContextManager[None]] | None = None,
               ) -> dict[ObjectKey, Body | None]:
    """What exists under each object's name in `namespace` (None: nothing), read together; `slot` bounds the
    reads in flight with the operator's writes. Any answer but 200 or 404 is raised."""
    wanted = {(o["kind"], o["metadata"]["name"]): o["apiVersion"] for o in objects}

    async def one(kind: str, name: str) -> Body | None:
        path = api_paths.path_for(wanted[(kind, name)], kind, namespace, name)
        try:
            async with slot() if slot is not None else contextlib.nullcontext():
                return await client.request("GET", path)
        except KubeError as e:
            if e.not_found:
                return None
            raise

    found = await asyncio.gather(*(one(*key) for key in wanted))
    return dict(zip(wanted, found, strict=True))
