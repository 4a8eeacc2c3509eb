"""`spec.router`: the SGLang router (`sglang_router.launch_router --pd-disaggregation`) in front of the pool."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import AfterValidator, Field

from pdfleet.operator.api.base import ApiModel, Rule
from pdfleet.operator.api.env import ENV_LIST_SCHEMA, MAX_ENV, UNIQUE_ENV, EnvName, EnvVarBase
from pdfleet.operator.api.scalars import Duration, ImageRef, Port
from pdfleet.operator.api.scheduling import Scheduling


class RouterPolicy(enum.StrEnum):
    """Worker selection policy, spelled as sglang-router's --prefill-policy / --decode-policy take it."""

    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    CACHE_AWARE = "cache_aware"
    POWER_OF_TWO = "power_of_two"


# The router container's variable holding its control-plane key (render/router_secret.py); its args refer to it as
# $(VAR), so a variable of this name in the spec would hand the router a key the operator does not have.
ROUTER_KEY_ENV = "PDFLEET_ROUTER_ADMIN_KEY"

_NOT_ROUTER_KEY = Rule(
    cel=f"self != '{ROUTER_KEY_ENV}'",
    holds=lambda name: name != ROUTER_KEY_ENV,
    message=f"router env may not set {ROUTER_KEY_ENV}: it carries the router's control-plane key, which only the "
            "operator sets",
    reason="FieldValueForbidden",
)


def _not_router_key(name: str) -> str:
    """Python's side of `_NOT_ROUTER_KEY`."""
    if not _NOT_ROUTER_KEY.holds(name):
        raise _NOT_ROUTER_KEY.error()
    return name


class RouterEnvVar(EnvVarBase):
    """An environment variable for the router container: a literal value, or a Secret's or ConfigMap's key."""

    name: Annotated[EnvName, Field(json_schema_extra={"x-kubernetes-validations": [_NOT_ROUTER_KEY.to_crd()]}),
                    AfterValidator(_not_router_key)] = Field(description="Variable name.")


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

    RULES = (UNIQUE_ENV,)

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
    env: tuple[RouterEnvVar, ...] = Field(
        default=(),
        max_length=MAX_ENV,
        description="Environment variables for the router container (sglang-router's, such as RUST_LOG, or a "
                    "Secret's key by reference). A change rolls the router Deployment; the engines keep running.",
        json_schema_extra=ENV_LIST_SCHEMA,
    )
