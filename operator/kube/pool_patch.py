"""Sends a `planning.spec_change.SpecChange` (a JSON Patch of the pool, guarded by its generation): the one way the
operator and the `pdfleet` CLI change a pool's own object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdfleet.operator.kube import api_paths
from pdfleet.operator.kube.kube_client import KubeClient, KubeError
from pdfleet.operator.planning.spec_change import SpecChange

Body = dict[str, Any]
JSON_PATCH = "application/json-patch+json"
# A patch whose `test` failed is answered 422 Invalid with only a generic message (as is one the schema refuses),
# or 409 Conflict by some versions: the pool is read again to tell which.
MAYBE_STALE = (409, 422)


async def patch_pool(client: KubeClient, pool: Mapping[str, Any], change: SpecChange) -> Body | None:
    """The pool as stored after `change`; None when the apiserver refused it because the pool's generation is no
    longer the one it was decided on (nothing was written). Other refusals raise KubeError."""
    path = api_paths.object_path(pool)
    try:
        return await client.request("PATCH", path, body=list(change.ops), content_type=JSON_PATCH)
    except KubeError as e:
        if e.status not in MAYBE_STALE:
            raise
        tested = next((op["value"] for op in change.ops
                       if op["op"] == "test" and op["path"] == "/metadata/generation"), None)
        try:
            now = await client.request("GET", path)
        except KubeError as gone:
            if gone.not_found:
                return None  # deleted meanwhile: nothing to change
            raise
        if tested is not None and now.get("metadata", {}).get("generation") != tested:
            return None
        raise
