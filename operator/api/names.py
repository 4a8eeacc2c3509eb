"""What an InferencePool may be called: every object the operator makes carries the pool's name, in its own name
or in a label value, and Kubernetes refuses what does not fit there.

The tightest places are 63-character DNS labels: an engine pod's name is also its `hostname`, the pool's
Services are DNS-1035 labels, and label values (`app.kubernetes.io/instance`, `pdfleet.dev/group`)
have 63 characters at most. The longest name derived from a pool is the pod of the last node of the last group
of the longer role at the API's maxima, `<pool>-prefill-1023-63`, so the pool's name gets what that suffix
leaves. Services must also start with a letter and hold no dots, which a pool name otherwise may.

Checked when a pool is created (names are immutable), by the apiserver through a CEL rule at the root of the
CRD and by the operator with the same rule, so a pool the operator could never build is refused before anything
is made. tests/unit/test_pool_names.py renders a pool named at the limit and checks every derived name and label
value, so the limit follows the rendering code.
"""

from __future__ import annotations

import re
from typing import Final

import annotated_types
from pydantic import BaseModel

from pdfleet.operator.api.base import Rule
from pdfleet.operator.api.roles import Role, RoleSpec

DNS_LABEL_MAX: Final = 63
DNS_1035_LABEL: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def maximum(model: type[BaseModel], field: str) -> int:
    """The largest value the API admits for an integer field (its `le` constraint)."""
    for constraint in model.model_fields[field].metadata:
        if isinstance(constraint, annotated_types.Le):
            return int(constraint.le)
    raise LookupError(f"{model.__name__}.{field} has no maximum")


# The suffix engine_group.GroupId.pod_name appends at the API's maxima: the longest of any derived name.
LONGEST_SUFFIX: Final = (f"-{max(Role, key=len)}-{maximum(RoleSpec, 'replicas') - 1}"
                         f"-{maximum(RoleSpec, 'nodes_per_group') - 1}")
MAX_LENGTH: Final = DNS_LABEL_MAX - len(LONGEST_SUFFIX)
PATH: Final = "metadata.name"

# `oldSelf.hasValue() ||`: only on create. The name never changes, and an older pool with a longer name must
# still take updates (its finalizer's removal among them) after this rule is installed.
LENGTH_RULE: Final = Rule(
    cel=f"oldSelf.hasValue() || self.metadata.name.size() <= {MAX_LENGTH}",
    holds=lambda name: len(name) <= MAX_LENGTH,
    message=f"{PATH}: must be at most {MAX_LENGTH} characters: the operator names the pool's objects after it, and "
            f"the longest, an engine pod <name>{LONGEST_SUFFIX}, must fit in a {DNS_LABEL_MAX}-character DNS "
            f"label, as must the label values that hold the name",
)
FORMAT_RULE: Final = Rule(
    cel=f"oldSelf.hasValue() || self.metadata.name.matches('{DNS_1035_LABEL}')",
    holds=lambda name: re.fullmatch(DNS_1035_LABEL, name) is not None,
    message=f"{PATH}: must start with a lowercase letter and hold only lowercase letters, digits and '-' "
            f"(a DNS-1035 label): the pool's Services are named after it",
)
RULES: Final = (LENGTH_RULE, FORMAT_RULE)


def to_crd() -> list[dict[str, str | bool]]:
    """The rules as the CRD's root `x-kubernetes-validations` (where CEL may read `metadata.name`)."""
    return [{**rule.to_crd(), "optionalOldSelf": True} for rule in RULES]


def problems(name: str) -> list[str]:
    """What is wrong with a pool's name, in the rules' words after `metadata.name: `; [] when it fits."""
    return [rule.message.removeprefix(f"{PATH}: ") for rule in RULES if not rule.holds(name)]
