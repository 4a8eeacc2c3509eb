"""Revisions: a short hash of everything in the spec that shapes an engine of one role.

A change that shapes an engine (image, patches, switches, args, model, transfer, the role's parallelism,
resources and scheduling) makes a new revision and so a replacement of that role's groups; a change that does
not (replicas, router, health and rollout policy) keeps the revision, so scaling never restarts anything.
"""

from __future__ import annotations

import hashlib
import json

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec

_ROLE_FIELDS_THAT_DO_NOT_SHAPE_AN_ENGINE = {"replicas"}


def _digest(data: object) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def role_revision(spec: InferencePoolSpec, role: Role) -> str:
    shape = spec.role(role).model_dump(mode="json", exclude=_ROLE_FIELDS_THAT_DO_NOT_SHAPE_AN_ENGINE)
    return _digest({
        "role": str(role),
        "model": spec.model.model_dump(mode="json"),
        "engine": spec.engine.model_dump(mode="json"),
        "transfer": spec.transfer.model_dump(mode="json"),
        "shape": shape,
    })


def pool_revision(spec: InferencePoolSpec) -> str:
    """The pool's revision as status shows it: both roles' revisions together."""
    return _digest([role_revision(spec, role) for role in Role])
