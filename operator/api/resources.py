"""Compute resources of an engine pod, other than GPUs (those follow from `gpusPerNode`)."""

from __future__ import annotations

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule
from pdfleet.operator.api.scalars import Quantity

GPU_RESOURCE = "nvidia.com/gpu"

_NO_GPU_LIMIT = Rule(
    cel=f"!has(self.limits) || !('{GPU_RESOURCE}' in self.limits)",
    holds=lambda r: GPU_RESOURCE not in r.limits,
    message=f"resources.limits may not set {GPU_RESOURCE}: the operator sets it from gpusPerNode",
    field=".limits",
    reason="FieldValueForbidden",
)
_NO_GPU_REQUEST = Rule(
    cel=f"!has(self.requests) || !('{GPU_RESOURCE}' in self.requests)",
    holds=lambda r: GPU_RESOURCE not in r.requests,
    message=f"resources.requests may not set {GPU_RESOURCE}: the operator sets it from gpusPerNode",
    field=".requests",
    reason="FieldValueForbidden",
)


class Resources(ApiModel):
    """CPU, memory and other requests/limits for each engine pod, as in a container's `resources`."""

    RULES = (_NO_GPU_LIMIT, _NO_GPU_REQUEST)

    requests: dict[str, Quantity] = Field(
        default_factory=dict, max_length=16, description="Minimum resources per pod, e.g. {cpu: 16, memory: 256Gi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, max_length=16, description="Maximum resources per pod, e.g. {memory: 512Gi}."
    )
