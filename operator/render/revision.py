"""Revisions: a short hash of everything in the spec that shapes an engine of one role.

A change that shapes an engine (image, patches, switches, args, model, transfer, the role's parallelism,
resources and scheduling) makes a new revision and so a replacement of that role's groups; a change that does
not (replicas, router, health and rollout policy) keeps the revision, so scaling never restarts anything.
"""

from __future__ import annotations

import hashlib
import json
import weakref

from pdfleet.operator.api.roles import DEFAULT_DRAIN_SECONDS, Role
from pdfleet.operator.api.spec import InferencePoolSpec

_ROLE_FIELDS_THAT_DO_NOT_SHAPE_AN_ENGINE = {"replicas", "scale_target"}
# Role fields added after pools existed, each with the value (its default) that renders exactly the pods those
# pools already run: left out of the revision while they hold it, so upgrading the operator rolls out no pool.
# Another value changes the pods, and the revision. (A field whose default is None needs nothing here: the wire
# form leaves None out.) tests/unit/test_revision_pins.py fails when a change moves the examples' revisions.
_ADDED_WITH_A_NEUTRAL_DEFAULT = {"drainSeconds": DEFAULT_DRAIN_SECONDS}
# How the patch set was chosen is not what the engines run: the set itself (engine.patches, resolved by
# planning/patch_set.py before anything renders) is. Left out, so a pool resolved to the same set is the same
# revision whichever way it got there.
_ENGINE_FIELDS_THAT_DO_NOT_SHAPE_AN_ENGINE = {"patch_policy"}
# Revisions of the specs alive, by the spec object's identity. One plan asks for the pool's revision in several
# places, each a dump, JSON and SHA-256 of the engine-shaping sections (a fifth of a steady-state plan), and every
# plan and health poll of a pool asks again of the same spec object (the render cache keeps one per pool and
# generation). Specs are frozen. An entry holds its spec weakly and goes when the spec is freed (a spec validated
# for one use leaves nothing behind), so an id here is never another object's. It was an LRU of 32 specs, which
# missed at every plan and poll once more than 32 pools were reconciled in turn: 3.6% of the operator's CPU in the
# 100-pool benchmark (docs/operator-throughput.md).
_memo: dict[int, tuple[weakref.ref[InferencePoolSpec], dict[Role | None, str]]] = {}


def _digest(data: object) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _kept(spec: InferencePoolSpec) -> dict[Role | None, str]:
    """The revisions already computed for this very spec object (None: the pool's)."""
    key = id(spec)
    kept = _memo.get(key)
    if kept is None or kept[0]() is not spec:
        kept = (weakref.ref(spec, lambda ref: _freed(key, ref)), {})
        _memo[key] = kept
    return kept[1]


def _freed(key: int, ref: weakref.ref[InferencePoolSpec]) -> None:
    """A spec was freed: its revisions go with it (unless its id already names another spec's entry)."""
    kept = _memo.get(key)
    if kept is not None and kept[0] is ref:
        del _memo[key]


def role_revision(spec: InferencePoolSpec, role: Role) -> str:
    kept = _kept(spec)
    if (known := kept.get(role)) is None:
        known = kept[role] = _role_revision(spec, role)
    return known


def _role_revision(spec: InferencePoolSpec, role: Role) -> str:
    shape = spec.role(role).model_dump(mode="json", exclude=_ROLE_FIELDS_THAT_DO_NOT_SHAPE_AN_ENGINE)
    for key, neutral in _ADDED_WITH_A_NEUTRAL_DEFAULT.items():
        if shape.get(key) == neutral:
            del shape[key]
    return _digest({
        "role": str(role),
        "model": spec.model.model_dump(mode="json"),
        "engine": spec.engine.model_dump(mode="json", exclude=_ENGINE_FIELDS_THAT_DO_NOT_SHAPE_AN_ENGINE),
        "transfer": spec.transfer.model_dump(mode="json"),
        "shape": shape,
    })


def pool_revision(spec: InferencePoolSpec) -> str:
    """The pool's revision as status shows it: both roles' revisions together."""
    kept = _kept(spec)
    if (known := kept.get(None)) is None:
        known = kept[None] = _digest([role_revision(spec, role) for role in Role])
    return known
