"""`spec.engine`: the SGLang build every engine of the pool runs, its patches and its switches.

Every field here shapes the engine's process, so a change to `engine` is a new revision and starts a rollout.
Flags the operator derives from typed fields are refused in `extraArgs` (see `flags.py`): one flag, one owner.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from pdfleet.operator.api import flags
from pdfleet.operator.api.base import RULE_ERROR, ApiModel, Rule
from pdfleet.operator.api.patches import PatchId
from pdfleet.operator.api.scalars import DnsSubdomain, ImageRef

MAX_EXTRA_ARGS = 64
MAX_EXTRA_ARG_LENGTH = 256

# SGLang releases are PEP 440 versions: 0.5.23, 0.5.24rc1, 0.5.23.post2.
SGLANG_VERSION_PATTERN = r"^[0-9]+\.[0-9]+\.[0-9]+((a|b|rc|\.post|\.dev)[0-9]+)?$"


class Switch(enum.StrEnum):
    """A feature switch. Spelled out rather than a bool so a diff of the spec reads as what it does."""

    ENABLED = "Enabled"
    DISABLED = "Disabled"


class PatchPolicy(enum.StrEnum):
    """How the pool's patch set is chosen (`patches` adds to Recommended; it is the whole set under Explicit)."""

    RECOMMENDED = "Recommended"
    EXPLICIT = "Explicit"


class PullPolicy(enum.StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


_NOT_MANAGED = Rule(
    cel=f"!self.startsWith('--') || !{flags.cel_list()}.exists(f, f.startsWith(self.split('=')[0]))",
    holds=lambda arg: flags.reserved_flag(arg) is None,
    message="extraArgs may not set a flag the operator manages (or an abbreviation of one); use the typed field",
    message_expression="'extraArgs may not set ' + self.split('=')[0] + ': it is (or abbreviates) a flag the "
                       "operator manages; use the typed field'",
    reason="FieldValueForbidden",
)


def _not_managed(arg: str) -> str:
    """Python's side of `_NOT_MANAGED`, naming the flag and the field that owns it."""
    flag = flags.reserved_flag(arg)
    if flag is not None:
        raise PydanticCustomError(
            RULE_ERROR,
            "extraArgs may not set {flag} (or an abbreviation of it): it is set from {owner}",
            {"flag": flag, "owner": flags.MANAGED_FLAGS[flag], "field": ""},
        )
    return arg


ExtraArg = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_EXTRA_ARG_LENGTH,
        json_schema_extra={"x-kubernetes-validations": [_NOT_MANAGED.to_crd()]},
    ),
    AfterValidator(_not_managed),
]


_NOT_REFUSED_ENV = Rule(
    cel="!(self in " + flags.cel_list(flags.REFUSED_ENV) + ")",
    holds=lambda name: name not in flags.REFUSED_ENV,
    message="env may not set a variable that turns agreement across TP ranks off, starts the SGLang gRPC server or "
            f"is the operator's to set ({', '.join(flags.REFUSED_ENV)})",
    message_expression="'env may not set ' + self + ': it turns agreement across TP ranks off, starts the SGLang "
                       "gRPC server or is the operator\\'s to set (docs/desync-audit.md item 17)'",
    reason="FieldValueForbidden",
)


def _not_refused_env(name: str) -> str:
    """Python's side of `_NOT_REFUSED_ENV`, naming the variable and why."""
    if name in flags.REFUSED_ENV:
        raise PydanticCustomError(RULE_ERROR, "env may not set {name}: {why} (docs/desync-audit.md)",
                                  {"name": name, "why": flags.REFUSED_ENV[name], "field": ""})
    return name


class SecretKeyRef(ApiModel):
    """A key of a Secret in the pool's namespace. kubelet reads it when it starts the container: the operator never
    reads it, and the value is in no pool, pod spec, revision or history, only in the engine's environment."""

    name: DnsSubdomain = Field(description="The Secret's name, in the pool's namespace.")
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = Field(
        description="The key in the Secret.")
    optional: bool | None = Field(default=None, description="Start without the variable when the Secret or its key "
                                                            "is missing (default: the container does not start).")


class EnvVarSource(ApiModel):
    """Where a variable's value comes from instead of the spec."""

    secret_key_ref: SecretKeyRef = Field(description="A key of a Secret in the pool's namespace.")


_VALUE_OR_SOURCE = Rule(
    cel="!has(self.valueFrom) || !has(self.value) || self.value == ''",
    holds=lambda e: e.value_from is None or e.value == "",
    message="env: set value or valueFrom, not both",
    field=".valueFrom",
)


class EnvVar(ApiModel):
    """An environment variable for every engine container: a literal value, or a Secret's key (`valueFrom`), which
    is what a credential such as a gated model's HF_TOKEN should use."""

    RULES = (_VALUE_OR_SOURCE,)

    name: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
                               json_schema_extra={"x-kubernetes-validations": [_NOT_REFUSED_ENV.to_crd()]}),
                    AfterValidator(_not_refused_env)] = Field(description="Variable name.")
    value: Annotated[str, Field(max_length=4096)] = Field(
        default="", description="Variable value, written in the pool (and so in its pods and revision history).")
    value_from: EnvVarSource | None = Field(
        default=None, description="Take the value from a Secret instead: it stays out of the pool and its history.")

    def to_container(self) -> dict[str, object]:
        """The container's env entry, as kubelet takes it."""
        if self.value_from is None:
            return {"name": self.name, "value": self.value}
        ref = self.value_from.secret_key_ref
        selector: dict[str, object] = {"name": ref.name, "key": ref.key}
        if ref.optional is not None:
            selector["optional"] = ref.optional
        return {"name": self.name, "valueFrom": {"secretKeyRef": selector}}


def _unique(values: tuple[str, ...]) -> bool:
    return len(set(values)) == len(values)


# The apiserver enforces these two through x-kubernetes-list-type (map keyed by name; set), so no CEL.
_UNIQUE_ENV = Rule(
    cel=None,
    holds=lambda e: _unique(tuple(v.name for v in e.env)),
    message="env names must be unique",
    field=".env",
)
_UNIQUE_PATCHES = Rule(
    cel=None,
    holds=lambda e: _unique(e.patches),
    message="patches must not repeat an id",
    field=".patches",
)


class EngineSpec(ApiModel):
    """The SGLang engine: image, version, patches, typed switches and pass-through arguments."""

    RULES = (_UNIQUE_ENV, _UNIQUE_PATCHES)

    image: ImageRef = Field(description="Container image with SGLang (and pdfleet's runtime) installed.")
    image_pull_policy: PullPolicy = Field(default=PullPolicy.IF_NOT_PRESENT, description="When to pull the image.")
    sglang_version: Annotated[str, Field(pattern=SGLANG_VERSION_PATTERN, max_length=32)] = Field(
        description="SGLang version inside the image, e.g. 0.5.23. Patches are checked against it."
    )
    patch_policy: PatchPolicy = Field(
        default=PatchPolicy.RECOMMENDED,
        description="Recommended (the default): the engines run the catalogue's recommended fixes for "
                    "sglangVersion (the desync fixes) plus the patches listed. Explicit: exactly the patches "
                    "listed, none if none; the pool's status and a Warning Event name the fixes it runs without. "
                    "A running pool keeps the set it was rolled out with until its engine-shaping spec changes "
                    "(docs/patches.md).",
    )
    patches: tuple[PatchId, ...] = Field(
        default=(),
        max_length=16,
        description="Runtime patches the launcher applies to SGLang before it starts, by catalogue id: added to "
                    "the recommended ones, or the whole set under patchPolicy Explicit.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    overlap_schedule: Switch = Field(
        default=Switch.ENABLED,
        description="SGLang's overlap scheduler. Disabled adds --disable-overlap-schedule, which removes the "
                    "overlap-loop triggers of TP-collective desync (a mitigation, not a cure).",
    )
    tokenizer_batch_decode: Switch = Field(
        default=Switch.ENABLED,
        description="Batched detokenization. Disabled adds --disable-tokenizer-batch-decode, a workaround for "
                    "tool-call markup leaking on SGLang before 0.5.7 without the dsml-batch-decode-guard patch; "
                    "refused on 0.5.7, where the flag leaves the leak.",
    )
    extra_args: tuple[ExtraArg, ...] = Field(
        default=(),
        max_length=MAX_EXTRA_ARGS,
        description="Further SGLang arguments, appended in order. Flags the operator manages are refused.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    env: tuple[EnvVar, ...] = Field(
        default=(),
        max_length=64,
        description="Environment variables for every engine container.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
