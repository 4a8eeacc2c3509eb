"""What rendering needs besides the spec: the pool's identity and the operator's own settings."""

from __future__ import annotations

import dataclasses
from typing import Any

from pdfleet.operator.api import meta
from pdfleet.operator.api.pool_policy import PoolPolicy

# The runtime image an operator run without --runtime-image gives engine pods. The chart always passes
# --runtime-image (its runtime.image value), and its default is this same reference (charts/pdfleet/values.yaml,
# tag = the chart's appVersion); tests/unit/test_chart.py asserts they agree.
DEFAULT_RUNTIME_IMAGE = "ghcr.io/pdfleet/pdfleet-runtime:0.1.0"
DEFAULT_OPERATOR_NAMESPACE = "pdfleet-system"
# The chart's operator pods carry these (its selector labels, less the release's instance).
DEFAULT_OPERATOR_LABELS = (("app.kubernetes.io/component", "operator"), ("app.kubernetes.io/name", "pdfleet"))


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the operator was started with that shapes what it renders (flags, from the chart's values)."""

    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    network_policies: bool = True  # the default of every pool's spec.networkPolicy.enabled
    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE
    operator_labels: tuple[tuple[str, str], ...] = DEFAULT_OPERATOR_LABELS
    # What pools may ask for (the --allow-* flags): checked before anything is rendered, so not a render input.
    policy: PoolPolicy = dataclasses.field(default_factory=PoolPolicy)


@dataclasses.dataclass(frozen=True)
class RenderContext:
    pool: str
    namespace: str
    uid: str
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    # The name, in the pool's router-key Secret, of the key new router pods get (`planning.router.router_keys`).
    router_key: str = "key-1"
    # NetworkPolicies: rendered unless the pool says otherwise; the operator is the peer they let in.
    network_policies: bool = True
    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE
    operator_labels: tuple[tuple[str, str], ...] = DEFAULT_OPERATOR_LABELS

    @classmethod
    def of(cls, pool_body: dict[str, Any], settings: Settings | None = None, *,
           router_key: str = "key-1") -> RenderContext:
        meta = pool_body["metadata"]
        settings = settings or Settings()
        return cls(pool=meta["name"], namespace=meta["namespace"], uid=meta["uid"], router_key=router_key,
                   runtime_image=settings.runtime_image, network_policies=settings.network_policies,
                   operator_namespace=settings.operator_namespace, operator_labels=settings.operator_labels)

    def owner_reference(self) -> dict[str, Any]:
        return {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "name": self.pool,
                "uid": self.uid, "controller": True, "blockOwnerDeletion": True}

    def metadata(self, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": labels,
                                "ownerReferences": [self.owner_reference()]}
        if annotations:
            meta["annotations"] = annotations
        return meta
