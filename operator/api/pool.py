"""The InferencePool resource as a whole: type metadata, object metadata, spec and status."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pdfleet.operator.api.base import ApiModel
from pdfleet.operator.api.meta import API_VERSION, KIND
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import InferencePoolStatus


class InferencePool(ApiModel):
    """A prefill/decode disaggregated SGLang fleet (`pdfleet.dev/v1alpha1`, short name `pdpool`)."""

    api_version: Literal["pdfleet.dev/v1alpha1"] = Field(default=API_VERSION, description="pdfleet.dev/v1alpha1")
    kind: Literal["InferencePool"] = Field(default=KIND, description="InferencePool")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: InferencePoolSpec = Field(description="Desired state of the pool.")
    status: InferencePoolStatus | None = Field(default=None, description="Observed state, set by the operator.")
