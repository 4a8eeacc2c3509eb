"""Revisions: a short hash of everything in the spec that shapes an engine of one role.

A change that shapes an engine (image, patches, switches, args, model, transfer, the role's parallelism,
resources and scheduling) makes a new revision and so a replacement of that role's groups; a change that does
not (replicas, router, health and rollout policy) keeps the revision, so scaling never restarts anything.
"""

from __future__ import annotations

import collections
import hashlib
import json

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec

_ROLE_FIELDS_THAT_DO_NOT_SHAPE_AN_ENGINE = {"replicas", "scale_target"}
# Revisions of the specs seen last, by the spec object's identity. One plan asks for the pool's revision in
# several places, each a dump, JSON and SHA-256 of the engine-shaping sections (a fifth of a steady-state plan).
# Specs are frozen, and each entry holds its spec, so an id here is never reused by another object while kept.
# Small: a plan asks about one spec, without awaiting anything in between (the health monitor validates a new
# spec object at every poll, and 512 of them kept 7 MB).
_MEMO_SIZE = 32
_memo: collections.OrderedDict[int, tuple[InferencePoolSpec, dict[Role, str]]] = collections.OrderedDict()


def _digest(data: object) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _kept(spec: InferencePoolSpec) -> dict[Role | None, str]:
    """The revisions already computed for this very spec object (None: the pool's)."""
    kept = _memo.get(id(spec))
    if kept is None or kept[0] is not spec:
        kept = (spec, {})
        _memo[id(spec)] = kept
        if len(_memo) > _MEMO_SIZE:
            _memo.popitem(last=False)
    else:
        _memo.move_to_end(id(spec))
    return kept[1]


def role_revision(spec: InferencePoolSpec, role: Role) -> str:
    kept = _kept(spec)
    if (known := kept.get(role)) is None:
        known = kept[role] = _role_revision(spec, role)
    return known


def _role_revision(spec: InferencePoolSpec, role: Role) -> str:
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
    kept = _kept(spec)
    if (known := kept.get(None)) is None:
        known = kept[None] = _digest([role_revision(spec, role) for role in Role])
    return known
