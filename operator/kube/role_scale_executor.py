"""Sends a `planning.scale.role_scale_plan.RoleScalePlan`: the pool's replicas first (a scale the pool refuses changes
nothing else), then each InferencePoolRole's create, delete, replicas and status, then the Events."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from pdfleet.operator.api import meta as api_meta
from pdfleet.operator.api import role_scale
from pdfleet.operator.kube import api_paths, pool_patch
from pdfleet.operator.kube import events as kube_events
from pdfleet.operator.kube.kube_client import KubeClient, KubeError
from pdfleet.operator.planning.scale.role_scale_plan import RoleScalePlan, RoleStep

log = logging.getLogger(__name__)

Body = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"


def path(namespace: str, name: str, *, status: bool = False) -> str:
    return api_paths.path_for(api_meta.API_VERSION, role_scale.KIND, namespace, name) + ("/status" if status else "")


async def execute(client: KubeClient, pool: Mapping[str, Any], plan: RoleScalePlan) -> Written:
    """What was written that a watch may not show yet: the pool as stored after its patch, and the
    observedGeneration written to each InferencePoolRole, by name."""
    namespace = pool["metadata"]["namespace"]
    written = Written()
    if plan.pool_change is not None:
        stored = await pool_patch.patch_pool(client, pool, plan.pool_change)
        if stored is None:
            log.info("pool %s/%s changed before its scale was written; the next event decides again",
                     namespace, pool["metadata"]["name"])
            return written
        written.pool = stored
    for step in plan.steps:
        observed = await _step(client, namespace, step)
        if observed is not None:
            written.observed[step.name] = observed
    for event in plan.events:
        try:
            await client.create(kube_events.event_body({**pool, "apiVersion": api_meta.API_VERSION,
                                                        "kind": api_meta.KIND}, event))
        except KubeError as e:
            log.warning("could not post event %s about %s/%s: %s", event.reason, namespace,
                        pool["metadata"]["name"], e)


    return written


@dataclasses.dataclass
class Written:
    pool: Body | None = None
    observed: dict[str, int] = dataclasses.field(default_factory=dict)


async def _step(client: KubeClient, namespace: str, step: RoleStep) -> int | None:
    """Sends one step; the observedGeneration it wrote, if any."""
    if step.delete_uid is not None:
        await client.delete(api_meta.API_VERSION, role_scale.KIND, namespace, step.name, uid=step.delete_uid)
        return None
    generation = step.observed_generation
    if step.create is not None:
        try:
            generation = (await client.create(step.create))["metadata"].get("generation")
        except KubeError as e:
            if e.status != 409:  # already there: the watch shows it, and the next event mirrors it
                raise
            return None
    elif step.replicas is not None:
        body = {"metadata": {"resourceVersion": step.resource_version}, "spec": {"replicas": step.replicas}}
        try:
            stored = await client.request("PATCH", path(namespace, step.name), body=body, content_type=MERGE_PATCH)
        except KubeError as e:
            if e.status in (404, 409):  # scaled or gone meanwhile: the next event decides again
                return None
            raise
        generation = stored["metadata"].get("generation")
    if step.status is None:
        return None
    # A merge patch keeps what it does not name: a message no longer true is removed with a null.
    status = {"message": None, **step.status}
    if generation is not None:
        status["observedGeneration"] = generation
    try:
        await client.request("PATCH", path(namespace, step.name, status=True), body={"status": status},
                             content_type=MERGE_PATCH)
    except KubeError as e:
        if e.status != 404:
            raise
        return None
    return generation
