"""`spec.rollout`: how a new engine revision replaces the old one.

A change to anything that shapes the engine process is a new revision. Groups of the old revision are replaced
whole, a role at a time in `order`, at most `maxUnavailable` groups of a role out of service at once; a group
counts as replaced when every pod of the new revision is Ready.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.base import ApiModel


class RolloutOrder(enum.StrEnum):
    DECODE_FIRST = "DecodeFirst"
    PREFILL_FIRST = "PrefillFirst"


class MaxUnavailable(ApiModel):
    """Engine groups of each role that may be out of service at once during a rollout."""

    prefill: Annotated[int, Field(ge=1, le=1024)] = Field(default=1, description="Prefill groups at once.")
    decode: Annotated[int, Field(ge=1, le=1024)] = Field(default=1, description="Decode groups at once.")


class RolloutSpec(ApiModel):
    """Rollout policy."""

    max_unavailable: MaxUnavailable = Field(default_factory=MaxUnavailable, description="Per-role disruption limit.")
    order: RolloutOrder = Field(default=RolloutOrder.DECODE_FIRST, description="Which role is replaced first.")
