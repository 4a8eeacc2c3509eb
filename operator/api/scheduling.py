"""Where engine pods may run: node selector, tolerations, affinity, priority."""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule


class TolerationOperator(enum.StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


_EXISTS_HAS_NO_VALUE = Rule(
    cel="self.operator != 'Exists' || !has(self.value) || self.value == ''",
    holds=lambda t: t.operator != TolerationOperator.EXISTS or not t.value,
    message="a toleration with operator Exists may not set value",
    field=".value",
)


class Toleration(ApiModel):
    """A core/v1 Toleration: lets engine pods onto nodes with a matching taint (GPU nodes often have one)."""

    RULES = (_EXISTS_HAS_NO_VALUE,)

    key: Annotated[str, Field(max_length=316)] | None = Field(
        default=None, description="Taint key; empty with operator Exists matches every taint."
    )
    operator: TolerationOperator = Field(default=TolerationOperator.EQUAL, description="Exists or Equal.")
    value: Annotated[str, Field(max_length=63)] | None = Field(default=None, description="Taint value (Equal).")
    effect: TaintEffect | None = Field(default=None, description="Taint effect to match; empty matches all.")
    toleration_seconds: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="How long a NoExecute taint is tolerated before eviction."
    )


class Scheduling(ApiModel):
    """Pod placement for one role's engine pods."""

    node_selector: dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=32, description="Node labels an engine pod's node must have."
    )
    tolerations: tuple[Toleration, ...] = Field(
        default=(), max_length=32, description="Taints engine pods tolerate.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="A core/v1 Affinity, passed to the pods unchanged (nodeAffinity, podAntiAffinity, ...).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    priority_class_name: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="PriorityClass of engine pods."
    )
