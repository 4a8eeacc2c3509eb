"""`spec.router`: the SGLang router (`sglang_router.launch_router --pd-disaggregation`) in front of the pool."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.base import ApiModel
from pdfleet.operator.api.scalars import Duration, ImageRef, Port
from pdfleet.operator.api.scheduling import Scheduling


class RouterPolicy(enum.StrEnum):
    """Worker selection policy, spelled as sglang-router's --prefill-policy / --decode-policy take it."""

    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    CACHE_AWARE = "cache_aware"
    POWER_OF_TWO = "power_of_two"


class CircuitBreaker(ApiModel):
    """sglang-router's per-worker circuit breakers. Off by default: in PD mode the router charges a failed
    request to both workers of its pair, so one hung or dying engine opens the circuits of healthy engines of the
    other role, and a router answers 503 for every request until they close (measured: docs/router.md). The
    operator's rank health takes a sick engine out of every router within one heartbeat instead. Turned on, the
    operator still resets circuits that a fault elsewhere in the pool opened on engines it judges healthy, and a
    router with no available engine of a role is not Ready."""

    enabled: bool = Field(default=False, description="Run the router with circuit breakers.")
    failure_threshold: Annotated[int, Field(ge=1, le=10000)] = Field(
        default=10, description="Failed requests within window that open a worker's circuit.")
    window: Duration = Field(default="30s", description="The sliding window failures are counted in.")
    open_for: Duration = Field(
        default="10s", description="How long an open circuit stays open before the router tries the worker again.")


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
    circuit_breaker: CircuitBreaker = Field(
        default_factory=CircuitBreaker, description="Per-worker circuit breakers in the router (off by default).")
