"""What rendering needs besides the spec: the pool's identity and the operator's own settings."""

from __future__ import annotations

import dataclasses
from typing import Any

from pdfleet.operator.api import meta

DEFAULT_RUNTIME_IMAGE = "ghcr.io/pdfleet/pdfleet-runtime:0.1.0"


@dataclasses.dataclass(frozen=True)
class RenderContext:
    pool: str
    namespace: str
    uid: str
    runtime_image: str = DEFAULT_RUNTIME_IMAGE

    @classmethod
    def of(cls, pool_body: dict[str, Any], *, runtime_image: str = DEFAULT_RUNTIME_IMAGE) -> RenderContext:
        meta = pool_body["metadata"]
        return cls(pool=meta["name"], namespace=meta["namespace"], uid=meta["uid"], runtime_image=runtime_image)

    def owner_reference(self) -> dict[str, Any]:
        return {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "name": self.pool,
                "uid": self.uid, "controller": True, "blockOwnerDeletion": True}

    def metadata(self, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": labels,
                                "ownerReferences": [self.owner_reference()]}
        if annotations:
            meta["annotations"] = annotations
        return meta
