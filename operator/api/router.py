"""`spec.router`: the SGLang router (`sglang_router.launch_router --pd-disaggregation`) in front of the pool."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.base import ApiModel
from pdfleet.operator.api.scalars import ImageRef, Port
from pdfleet.operator.api.scheduling import Scheduling


class RouterPolicy(enum.StrEnum):
    """Worker selection policy, spelled as sglang-router's --prefill-policy / --decode-policy take it."""

    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    CACHE_AWARE = "cache_aware"
    POWER_OF_TWO = "power_of_two"


class RouterSpec(ApiModel):
    """The PD router."""

    replicas: Annotated[int, Field(ge=0, le=64)] = Field(
        default=2, description="Router pods. Two by default, spread across nodes and kept by a "
        "PodDisruptionBudget, so one router's death or eviction costs only the requests in flight on it. 0 runs "
        "the pool without a router (clients talk to engines)."
    )
    image: ImageRef | None = Field(
        default=None, description="Router image; defaults to the engine image (SGLang images ship the router)."
    )
    port: Port = Field(default=30000, description="HTTP port of the router.")
    prefill_policy: RouterPolicy = Field(
        default=RouterPolicy.CACHE_AWARE, description="How the router picks a prefill engine."
    )
    decode_policy: RouterPolicy = Field(
        default=RouterPolicy.ROUND_ROBIN, description="How the router picks a decode engine."
    )
    scheduling: Scheduling = Field(default_factory=Scheduling, description="Where router pods may run.")
