"""Why Kueue has not admitted a gang: its Workload's QuotaReserved=False message ("insufficient unused quota
...", "LocalQueue q doesn't exist", a topology with no room), read for the groups whose pods Kueue holds, so the
group's status can say it (planning/scale/gang_wait.py). Workloads are Kueue's objects, not the pool's: they are read
by name (a gang's Workload is named after it), never watched, and only while a gang waits. A read is kept for
`ttl` seconds, so a pool that reconciles every second costs one GET per waiting gang per `ttl`. Without Kueue's
CRD, or without the permission to read Workloads, there is no reason to give and the status says only that the
group waits in its queue."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from pdfleet.operator.kube.kube_client import KubeClient, KubeError

log = logging.getLogger(__name__)
API = "/apis/kueue.x-k8s.io/v1beta2"


def quota_refusal(workload: Mapping[str, Any]) -> str | None:
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "QuotaReserved" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "") or None
    return None


class WorkloadReasons:
    def __init__(self, client: KubeClient, *, ttl: float = 2.0) -> None:
        self._client = client
        self._ttl = ttl
        self._kept: dict[tuple[str, str], tuple[float, str | None]] = {}

    async def read(self, namespace: str, gangs: Iterable[str]) -> dict[str, str]:
        """Kueue's reason for each of `gangs` (Workload names) that it refuses, by name."""
        now = time.monotonic()
        wanted = {(namespace, name) for name in gangs}
        self._kept = {k: v for k, v in self._kept.items() if k in wanted or k[0] != namespace}
        out: dict[str, str] = {}
        for key in sorted(wanted):
            at, reason = self._kept.get(key, (float("-inf"), None))
            if now - at >= self._ttl:
                reason = await self._read(*key)
                self._kept[key] = (now, reason)
            if reason:
                out[key[1]] = reason
        return out

    async def _read(self, namespace: str, name: str) -> str | None:
        try:
            return quota_refusal(await self._client.request("GET", f"{API}/namespaces/{namespace}/workloads/{name}",
                                                            timeout=5))
        except KubeError as e:
            if e.status not in (403, 404):
                log.warning("could not read Kueue Workload %s/%s: %s", namespace, name, e)
            return None

    async def release(self, pods: Iterable[Mapping[str, Any]], finalizer: str) -> None:
        """Takes `finalizer` off each of `pods` (planning/scale/gang_wait.stranded chose them), by a JSON patch that
        tests the finalizer list it read, so a list someone changed meanwhile is left for the next reconcile."""
        for pod in pods:
            meta = pod["metadata"]
            kept = [f for f in meta.get("finalizers") or [] if f != finalizer]
            ops = [{"op": "test", "path": "/metadata/finalizers", "value": meta.get("finalizers")},
                   {"op": "replace", "path": "/metadata/finalizers", "value": kept}]
            try:
                await self._client.request("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                           body=ops, content_type="application/json-patch+json", timeout=5)
                log.info("took Kueue's finalizer off %s/%s: deleted, and it holds nothing (never admitted, or its "
                         "containers ended)", meta["namespace"], meta["name"])
            except KubeError as e:
                if e.status not in (404, 409, 422):
                    log.warning("could not take Kueue's finalizer off %s/%s: %s", meta["namespace"], meta["name"], e)

