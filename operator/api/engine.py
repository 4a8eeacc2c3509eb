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
from pdfleet.operator.api.env import ENV_LIST_SCHEMA, MAX_ENV, UNIQUE_ENV, EnvName, EnvVarBase
from pdfleet.operator.api.patches import PatchId
from pdfleet.operator.api.scalars import ImageRef

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


class EnvVar(EnvVarBase):
    """An environment variable for every engine container: a literal value, or a Secret's or ConfigMap's key
    (`valueFrom`), which is what a credential such as a gated model's HF_TOKEN should use."""

    name: Annotated[EnvName, Field(json_schema_extra={"x-kubernetes-validations": [_NOT_REFUSED_ENV.to_crd()]}),
                    AfterValidator(_not_refused_env)] = Field(description="Variable name.")


def _unique(values: tuple[str, ...]) -> bool:
    return len(set(values)) == len(values)


# The apiserver enforces this through x-kubernetes-list-type set, so no CEL.
_UNIQUE_PATCHES = Rule(
    cel=None,
    holds=lambda e: _unique(e.patches),
    message="patches must not repeat an id",
    field=".patches",
)


MAX_ID = 2147483647  # what Kubernetes takes for a user or group id
_GROUP_NEEDS_USER = Rule(
    cel="!has(self.runAsGroup) || has(self.runAsUser)",
    holds=lambda e: e.run_as_group is None or e.run_as_user is not None,
    message="runAsGroup needs runAsUser: engines without a user of their own run as their image's",
    field=".runAsGroup",
)


class EngineSpec(ApiModel):
    """The SGLang engine: image, version, patches, typed switches and pass-through arguments."""

    RULES = (UNIQUE_ENV, _UNIQUE_PATCHES, _GROUP_NEEDS_USER)

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
        max_length=MAX_ENV,
        description="Environment variables for every engine container.",
        json_schema_extra=ENV_LIST_SCHEMA,
    )
    run_as_user: Annotated[int, Field(ge=1, le=MAX_ID)] | None = Field(
        default=None,
        description="Run the engine pods as this user, not root (runAsNonRoot), for an image that works so: its "
                    "pods then meet Pod Security's restricted level, unless RDMA or a hostPath model takes them "
                    "out of baseline. Unset: the image's user, root for SGLang's images (baseline). The pool "
                    "policy may require it (requireNonRootEngines).",
    )
    run_as_group: Annotated[int, Field(ge=0, le=MAX_ID)] | None = Field(
        default=None, description="The primary group of runAsUser (default: the image's for that user).",
    )
