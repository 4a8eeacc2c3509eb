"""Conditions in the shape of metav1.Condition, so kubectl, kstatus and humans read them as usual."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AwareDatetime, Field, PlainSerializer

from pdfleet.operator.api.base import ApiModel


class ConditionType(enum.StrEnum):
    """The condition types pdfleet sets. Other writers may add their own types."""

    ACCEPTED = "Accepted"  # the spec passed every check, including those the apiserver cannot make
    READY = "Ready"  # every engine group of both roles serves, behind the router
    PROGRESSING = "Progressing"  # a rollout or scale is under way
    DEGRADED = "Degraded"  # some group is unhealthy, restarting or failed
    ROLLOUT_VERIFIED = "RolloutVerified"  # every group of the update revision passed its verification gates
    TOOL_CALL_INTEGRITY = "ToolCallIntegrity"  # no known cause leaks DSML tool calls into text on this build


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


def _rfc3339(moment: datetime) -> str:
    """metav1.Time's wire form: UTC, whole seconds, a trailing Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


Timestamp = Annotated[AwareDatetime, PlainSerializer(_rfc3339, return_type=str, when_used="json")]


class Condition(ApiModel):
    """One aspect of the pool's state. `lastTransitionTime` moves only when `status` changes."""

    type: Annotated[str, Field(min_length=1, max_length=316,
                               pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                                       r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$")] = Field(
        description="Condition type in CamelCase, e.g. Ready."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="metadata.generation the condition was computed from."
    )
    last_transition_time: Timestamp = Field(
        description="When status last changed.", json_schema_extra={"format": "date-time"}
    )
    reason: Annotated[str, Field(min_length=1, max_length=1024,
                                 pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")] = Field(
        description="Machine-readable CamelCase reason for the last transition."
    )
    message: Annotated[str, Field(max_length=32768)] = Field(default="", description="Human-readable details.")
