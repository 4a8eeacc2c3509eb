"""The Lease's reads and writes, through the operator's one door to the API (`kube.kube_client`).

Writes are conditional: an update carries the resourceVersion it read, and a 409 Conflict (on create or
update) means another replica wrote first: this replica lost the race, which is an answer, not an error.
"""

from __future__ import annotations

from pdfleet.operator.kube.kube_client import KubeClient, KubeError
from pdfleet.operator.leader import decision
from pdfleet.operator.leader.decision import LeaseRecord


class LeaseStore:
    def __init__(self, client: KubeClient, namespace: str, name: str) -> None:
        self._client = client
        self.namespace = namespace
        self.name = name
        self._collection = f"/apis/{decision.API_VERSION}/namespaces/{namespace}/leases"

    @property
    def _path(self) -> str:
        return f"{self._collection}/{self.name}"

    async def get(self, *, timeout: float) -> LeaseRecord | None:
        """The Lease's record, or None when there is no Lease yet."""
        try:
            return decision.parse(await self._client.request("GET", self._path, timeout=timeout))
        except KubeError as e:
            if e.not_found:
                return None
            raise

    async def create(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None:
        """The created record, or None when another replica created the Lease first."""
        body = decision.lease_body(self.namespace, self.name, record)
        return await self._conditional("POST", self._collection, body, timeout)

    async def update(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None:
        """The written record, or None when the Lease changed since `record.resource_version` was read."""
        body = decision.lease_body(self.namespace, self.name, record)
        return await self._conditional("PUT", self._path, body, timeout)

    async def _conditional(self, method: str, path: str, body: dict, timeout: float) -> LeaseRecord | None:
        try:
            return decision.parse(await self._client.request(method, path, body=body, timeout=timeout))
        except KubeError as e:
            if e.conflict:
                return None
            raise
