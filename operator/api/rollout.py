"""`spec.rollout`: how a new engine revision replaces the old one, and what the operator may change by itself.

A rollout drains a group from the router, replaces it, and verifies it (every rank in the expected event loop,
`/server_info` showing the expected args, the tool-call canary passing) before it moves on. Playbooks are
opt-in remedies the operator applies to the spec on its own when it detects a known failure.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.base import ApiModel
from pdfleet.operator.api.scalars import Duration


class RolloutOrder(enum.StrEnum):
    DECODE_FIRST = "DecodeFirst"
    PREFILL_FIRST = "PrefillFirst"


class MaxUnavailable(ApiModel):
    """Engine groups of each role that may be out of service at once during a rollout."""

    prefill: Annotated[int, Field(ge=1, le=1024)] = Field(default=1, description="Prefill groups at once.")
    decode: Annotated[int, Field(ge=1, le=1024)] = Field(default=1, description="Decode groups at once.")


class Verification(ApiModel):
    """Gates a replaced group must pass before the rollout continues."""

    event_loop: bool = Field(default=True, description="Every scheduler rank reports the expected event loop.")
    server_args: bool = Field(default=True, description="/server_info shows the args the operator rendered.")
    tool_call_canary: bool = Field(
        default=True, description="A parallel tool-call canary returns structured tool_calls, no markup leak."
    )
    timeout: Duration = Field(default="15m", description="How long a replaced group has to pass every gate.")


class OverlapDesyncAction(enum.StrEnum):
    """What to do when a group is found in a TP-collective desync while the overlap schedule is on."""

    RESTART = "Restart"
    DISABLE_OVERLAP_SCHEDULE = "DisableOverlapSchedule"


class OverlapDesyncPlaybook(ApiModel):
    action: OverlapDesyncAction = Field(
        default=OverlapDesyncAction.RESTART,
        description="Restart: restart the group only. DisableOverlapSchedule: also set "
                    "engine.overlapSchedule to Disabled, which rolls the whole pool out.",
    )


class Playbooks(ApiModel):
    """Known failures and the opt-in remedy for each."""

    overlap_desync: OverlapDesyncPlaybook = Field(
        default_factory=OverlapDesyncPlaybook, description="Remedy for a desync detected under the overlap loop."
    )


class RolloutSpec(ApiModel):
    """Rollout policy."""

    max_unavailable: MaxUnavailable = Field(default_factory=MaxUnavailable, description="Per-role disruption limit.")
    order: RolloutOrder = Field(default=RolloutOrder.DECODE_FIRST, description="Which role is replaced first.")
    verification: Verification = Field(default_factory=Verification, description="Gates after each replacement.")
    auto_rollback: bool = Field(
        default=True, description="Roll back to the last verified revision when a verification gate fails."
    )
    playbooks: Playbooks = Field(default_factory=Playbooks, description="Opt-in automatic remedies.")
