"""InferencePoolRole: one role of one pool as something Kubernetes' scalers can target.

A custom resource has one scale subresource, and a pool has two roles that scale apart. So a pool whose role sets
`scaleTarget: true` gets one small InferencePoolRole per such role, named `<pool>-<role>` and owned by the pool,
whose `/scale` (`kubectl scale`, a HorizontalPodAutoscaler, a KEDA ScaledObject) sets that role's replicas.

The pool's `spec.<role>.replicas` stays the one number the operator builds from. The operator mirrors the two
ways (`planning.scale.role_scale_plan`): a change to the InferencePoolRole's `spec.replicas` (its generation moves
past the `status.observedGeneration` the operator last wrote) is written into the pool's spec; a change to the pool's
replicas is written into the InferencePoolRole. Its status says how many groups of the role exist and are ready,
and the label selector of the role's engine pods, which an HPA on resource metrics needs.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import Field

from pdfleet.operator.api import meta, names
from pdfleet.operator.api.base import ApiModel, Rule
from pdfleet.operator.api.roles import Role, RoleSpec

KIND: Final = "InferencePoolRole"
LIST_KIND: Final = "InferencePoolRoleList"
PLURAL: Final = "inferencepoolroles"
SINGULAR: Final = "inferencepoolrole"
SHORT_NAMES: Final = ("pdrole",)
CRD_NAME: Final = f"{PLURAL}.{meta.GROUP}"

Count = Annotated[int, Field(ge=0)]
PoolName = Annotated[str, Field(min_length=1, max_length=names.MAX_LENGTH, pattern=names.DNS_1035_LABEL)]

# Transition rules: the apiserver checks them on update only; Python sees no previous object, so they hold there.
_POOL_IS_FIXED = Rule(cel="self.pool == oldSelf.pool", holds=lambda _: True,
                      message="pool is immutable: create another InferencePoolRole", field=".pool")
_ROLE_IS_FIXED = Rule(cel="self.role == oldSelf.role", holds=lambda _: True,
                      message="role is immutable: create another InferencePoolRole", field=".role")


def object_name(pool: str, role: Role) -> str:
    return f"{pool}-{role}"


class InferencePoolRoleSpec(ApiModel):
    """Which role of which pool, and how many engine groups it should run."""

    RULES = (_POOL_IS_FIXED, _ROLE_IS_FIXED)

    pool: PoolName = Field(description="The InferencePool (same namespace) whose role this is.")
    role: Role = Field(description="prefill or decode.")
    replicas: Annotated[int, Field(ge=0, le=names.maximum(RoleSpec, "replicas"))] = Field(
        description="Engine groups of the role; mirrored into the pool's spec.<role>.replicas.")


class InferencePoolRoleStatus(ApiModel):
    """What the operator last saw of the role."""

    replicas: Count = Field(default=0, description="Engine groups of the role that exist, any revision.")
    ready_replicas: Count = Field(default=0, description="Of those, the ones that serve (the pool's ready count).")
    selector: Annotated[str, Field(max_length=1024)] = Field(
        default="", description="Label selector of the role's engine pods (the scale subresource's selector).")
    observed_generation: Count | None = Field(
        default=None, description="The generation whose spec.replicas the pool's spec holds.")
    message: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, description="Why the spec is not mirrored, when it is not (the pool is gone, say).")


class InferencePoolRole(ApiModel):
    """One role of an InferencePool as a scale target (`pdfleet.dev/v1alpha1`, short name `pdrole`)."""

    api_version: Literal["pdfleet.dev/v1alpha1"] = Field(default=meta.API_VERSION, description=meta.API_VERSION)
    kind: Literal["InferencePoolRole"] = Field(default=KIND, description=KIND)
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: InferencePoolRoleSpec = Field(description="Desired replicas of the role.")
    status: InferencePoolRoleStatus | None = Field(default=None, description="Observed state, set by the operator.")
