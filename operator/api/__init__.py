"""The InferencePool API (`pdfleet.dev/v1alpha1`): typed models that are the single source of truth.

The CRD in `crds/` is generated from these models (`python -m pdfleet.operator.api.crd`), and the same models
validate a resource in Python with the same rules the apiserver enforces, so the operator can check a spec
before it acts on it. Import the names below; the submodules are an implementation detail.
"""

from pdfleet.operator.api.checks import Problem, validate
from pdfleet.operator.api.conditions import Condition, ConditionStatus, ConditionType
from pdfleet.operator.api.engine import EngineSpec, EnvVar, Switch
from pdfleet.operator.api.health import HealthSpec
from pdfleet.operator.api.meta import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAMES, VERSION
from pdfleet.operator.api.model import ModelSource, ModelSpec
from pdfleet.operator.api.pool import InferencePool
from pdfleet.operator.api.roles import DecodeSpec, PrefillSpec, Role, RoleSpec
from pdfleet.operator.api.rollout import RolloutOrder, RolloutSpec
from pdfleet.operator.api.router import RouterPolicy, RouterSpec
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import GroupStatus, InferencePoolStatus, Phase, RoleStatus, Verdict
from pdfleet.operator.api.transfer import TransferBackend, TransferSpec

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "VERSION",
    "Condition",
    "ConditionStatus",
    "ConditionType",
    "DecodeSpec",
    "EngineSpec",
    "EnvVar",
    "GroupStatus",
    "HealthSpec",
    "InferencePool",
    "InferencePoolSpec",
    "InferencePoolStatus",
    "ModelSource",
    "ModelSpec",
    "Phase",
    "PrefillSpec",
    "Problem",
    "Role",
    "RoleSpec",
    "RoleStatus",
    "RolloutOrder",
    "RolloutSpec",
    "RouterPolicy",
    "RouterSpec",
    "Switch",
    "TransferBackend",
    "TransferSpec",
    "Verdict",
    "validate",
]
