"""Environment variables of the pool's containers (`spec.engine.env`, `spec.router.env`): a literal value, or a key of
a Secret or ConfigMap by reference, which kubelet reads when it starts the container. The operator never reads a
referenced value, so it is in no pool, pod spec, revision or history: only in the container's environment.

Each section subclasses `EnvVarBase` with its own `name` type, since each refuses the names its own process must not
be given (the engines' agreement switches, the router's control-plane key).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule
from pdfleet.operator.api.scalars import DnsSubdomain

EnvName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]
ENV_LIST_SCHEMA: dict[str, Any] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
MAX_ENV = 64


class KeyRef(ApiModel):
    """One key of an object in the pool's namespace, as kubelet's key selectors take it."""

    name: DnsSubdomain = Field(description="The object's name, in the pool's namespace.")
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = Field(
        description="The key in it.")
    optional: bool | None = Field(default=None, description="Start without the variable when the object or its key "
                                                            "is missing (default: the container does not start).")


class SecretKeyRef(KeyRef):
    """A key of a Secret: for credentials, such as a gated model's HF_TOKEN."""


class ConfigMapKeyRef(KeyRef):
    """A key of a ConfigMap: settings kept beside the pool rather than in it."""


_ONE_SOURCE = Rule(
    cel="has(self.secretKeyRef) != has(self.configMapKeyRef)",
    holds=lambda s: (s.secret_key_ref is None) != (s.config_map_key_ref is None),
    message="env valueFrom: set exactly one of secretKeyRef and configMapKeyRef",
)


class EnvVarSource(ApiModel):
    """Where a variable's value comes from instead of the spec."""

    RULES = (_ONE_SOURCE,)

    secret_key_ref: SecretKeyRef | None = Field(default=None,
                                                description="A key of a Secret in the pool's namespace.")
    config_map_key_ref: ConfigMapKeyRef | None = Field(default=None,
                                                       description="A key of a ConfigMap in the pool's namespace.")


_VALUE_OR_SOURCE = Rule(
    cel="!has(self.valueFrom) || !has(self.value) || self.value == ''",
    holds=lambda e: e.value_from is None or e.value == "",
    message="env: set value or valueFrom, not both",
    field=".valueFrom",
)


class EnvVarBase(ApiModel):
    """An environment variable: a literal value, or a Secret's or ConfigMap's key (`valueFrom`), which is what a
    credential should use."""

    RULES = (_VALUE_OR_SOURCE,)

    name: EnvName = Field(description="Variable name.")
    value: Annotated[str, Field(max_length=4096)] = Field(
        default="", description="Variable value, written in the pool (and so in its pods and revision history).")
    value_from: EnvVarSource | None = Field(
        default=None, description="Take the value from a Secret's or ConfigMap's key instead: it stays out of the "
                                  "pool and its history.")

    def to_container(self) -> dict[str, object]:
        """The container's env entry, as kubelet takes it (a reference's `optional` only where it was written)."""
        if self.value_from is None:
            return {"name": self.name, "value": self.value}
        return {"name": self.name, "valueFrom": self.value_from.model_dump(mode="json")}


# For any section with `env`: the apiserver refuses a repeat through ENV_LIST_SCHEMA, so no CEL.
UNIQUE_ENV = Rule(
    cel=None,
    holds=lambda section: len({v.name for v in section.env}) == len(section.env),
    message="env names must be unique",
    field=".env",
)
