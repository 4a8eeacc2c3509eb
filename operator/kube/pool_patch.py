"""Sends a `planning.spec_change.SpecChange` (a JSON Patch of the pool, guarded by its generation): the one way the
operator and the `pdfleet` CLI change a pool's own object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdfleet.operator.kube import resources
from pdfleet.operator.kube.client import KubeClient, KubeError
from pdfleet.operator.planning.spec_change import SpecChange

Body = dict[str, Any]
JSON_PATCH = "application/json-patch+json"
# The apiserver's answers to a patch whose `test` failed (the spec moved on since the decision): 422 Invalid on
# current versions, 409 Conflict on some older ones.
STALE = (409, 422)


async def patch_pool(client: KubeClient, pool: Mapping[str, Any], change: SpecChange) -> Body | None:
    """The pool as stored after `change`; None when the apiserver refused it because the pool's generation is no
    longer the one it was decided on (nothing was written). Other refusals raise KubeError."""
    try:
        return await client.request("PATCH", resources.object_path(pool), body=list(change.ops),
                                    content_type=JSON_PATCH)
    except KubeError as e:
        if e.status in STALE and _generation_test_failed(e):
            return None
        raise


def _generation_test_failed(e: KubeError) -> bool:
    return e.status == 409 or "test" in e.message.lower() or "generation" in e.message.lower()
