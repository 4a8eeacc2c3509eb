"""What to do about a pool's InferencePoolRoles (`api.role_scale`): create, mirror, report, remove. Pure.

Replicas live in two places once a role is a scale target: the pool's `spec.<role>.replicas`, which the operator
builds from, and the InferencePoolRole's `spec.replicas`, which a scaler writes through `/scale`. Which one moved
is read from the InferencePoolRole's generation against the `status.observedGeneration` the operator last
wrote: past it, the InferencePoolRole was scaled and its number goes into the pool; at it, the pool's number
changed (a person's edit) and goes into the InferencePoolRole. Both changed before the operator saw either: the
scale wins, as an HPA's write wins over a Deployment's applied replicas.

A scale is held to the pool's ratio band (`ratio_band`: the other role follows, or the scale is clamped), and the
InferencePoolRole's status says what the band did. A scale the pool cannot take (0 replicas while the pool is not
paused: a PD pool needs both roles; a band no whole size fits) is not written; the InferencePoolRole's status says
why and its observedGeneration stays behind, so a later scale is still seen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from pdfleet.operator.api import meta as api_meta
from pdfleet.operator.api import role_scale
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.scaling import RatioBand
from pdfleet.operator.planning.plan import Event
from pdfleet.operator.planning.scale import ratio_band
from pdfleet.operator.planning.spec_change import SpecChange, patch
from pdfleet.operator.render import labels

Body = dict[str, Any]
DEFAULT_REPLICAS = 1  # the API's default for spec.<role>.replicas


@dataclasses.dataclass(frozen=True)
class RoleStep:
    """What to write for one role. A status follows a create or a replicas write with the generation that write
    made (`observed_generation` None: take it from the write's answer)."""

    role: Role
    name: str
    create: Body | None = None
    delete_uid: str | None = None  # delete the InferencePoolRole with this uid (the role is no scale target now)
    replicas: int | None = None  # write the InferencePoolRole's spec.replicas
    resource_version: str | None = None  # the version that write is decided on
    status: Body | None = None
    observed_generation: int | None = None

    @property
    def writes(self) -> bool:
        return bool(self.create or self.delete_uid or self.replicas is not None or self.status is not None)


class Result:
    """What became of a scale, as `pdfleet_role_scales_total` counts it."""

    TAKEN = "taken"
    FOLLOWED = "followed"  # the other role moved into the ratio band with it
    CLAMPED = "clamped"
    REFUSED = "refused"


@dataclasses.dataclass(frozen=True)
class RoleScalePlan:
    steps: tuple[RoleStep, ...] = ()
    pool_change: SpecChange | None = None
    events: tuple[Event, ...] = ()
    results: tuple[tuple[Role, str], ...] = ()  # each scale acted on, once: (role, Result)


def _labels(pool: str, role: Role) -> dict[str, str]:
    return {**labels.selector(pool), labels.ROLE: str(role)}


def selector(pool: str, role: Role) -> str:
    """The role's engine pods, as the scale subresource's label selector (an HPA on pod metrics reads it)."""
    return ",".join(f"{key}={value}" for key, value in _labels(pool, role).items())


def _role_spec(pool: Mapping[str, Any], role: Role) -> Mapping[str, Any]:
    return (pool.get("spec") or {}).get(str(role)) or {}


def _replicas(pool: Mapping[str, Any], role: Role) -> int:
    return int(_role_spec(pool, role).get("replicas", DEFAULT_REPLICAS))


def _counts(pool: Mapping[str, Any], role: Role) -> tuple[int, int]:
    status = pool.get("status") or {}
    existing = sum(1 for group in status.get("groups") or () if group.get("role") == str(role))
    ready = int((status.get(str(role)) or {}).get("ready", 0))
    return existing, ready


def desired_object(pool: Mapping[str, Any], role: Role) -> Body:
    """A new InferencePoolRole for `role`, owned by the pool (deleted with it), at the pool's replicas."""
    meta = pool["metadata"]
    return {
        "apiVersion": api_meta.API_VERSION,
        "kind": role_scale.KIND,
        "metadata": {
            "name": role_scale.object_name(meta["name"], role),
            "namespace": meta["namespace"],
            "labels": _labels(meta["name"], role),
            "ownerReferences": [{"apiVersion": api_meta.API_VERSION, "kind": api_meta.KIND, "name": meta["name"],
                                 "uid": meta["uid"], "controller": True}],
        },
        "spec": {"pool": meta["name"], "role": str(role), "replicas": _replicas(pool, role)},
    }


def _status(pool: Mapping[str, Any], role: Role, message: str | None) -> Body:
    existing, ready = _counts(pool, role)
    out: Body = {"replicas": existing, "readyReplicas": ready, "selector": selector(pool["metadata"]["name"], role)}
    if message:
        out["message"] = message
    return out


def _refusal(pool: Mapping[str, Any], role: Role, replicas: int) -> str | None:
    if replicas == 0 and not (pool.get("spec") or {}).get("paused", False):
        return (f"replicas 0 is not mirrored into the pool: {role}.replicas must be at least 1 unless the pool is "
                f"paused (a PD pool needs both roles)")
    return None


@dataclasses.dataclass(frozen=True)
class _Scale:
    """An InferencePoolRole scaled since the operator last mirrored it."""

    role: Role
    current: Mapping[str, Any]
    wanted: int


def plan(pool: Mapping[str, Any], objects: Iterable[Mapping[str, Any]]) -> RoleScalePlan:
    """The steps for `pool` (as last seen, status included) given its InferencePoolRoles (as last seen)."""
    pool_name = pool["metadata"]["name"]
    by_role = {str((o.get("spec") or {}).get("role")): o for o in objects}
    steps: list[RoleStep] = []
    events: list[Event] = []
    scales: list[_Scale] = []
    results: list[tuple[Role, str]] = []
    for role in Role:
        name = role_scale.object_name(pool_name, role)
        current = by_role.get(str(role))
        if not _role_spec(pool, role).get("scaleTarget", False):
            if current is not None:
                steps.append(RoleStep(role, name, delete_uid=current["metadata"].get("uid")))
            continue
        if current is None:
            steps.append(RoleStep(role, name, create=desired_object(pool, role), status=_status(pool, role, None)))
            continue
        scale = _scaled(pool, role, current)
        if scale is None:
            step = _mirror(pool, role, current)
            if step.writes:
                steps.append(step)
        elif (refusal := _refusal(pool, role, scale.wanted)) is not None:
            _refuse(pool, scale, refusal, steps, events, results)
        else:
            scales.append(scale)
    sizes = {role: _replicas(pool, role) for role in Role}
    held = ratio_band.hold(None if (pool.get("spec") or {}).get("paused") else _band(pool), sizes,
                           {scale.role: scale.wanted for scale in scales})
    for scale in scales:
        if held.refusal is not None:
            _refuse(pool, scale, held.refusal, steps, events, results)
            continue
        results.append((scale.role, Result.TAKEN if held.note is None else Result.CLAMPED
                        if held.replicas[scale.role] != scale.wanted else Result.FOLLOWED))
        name, meta = scale.current["metadata"]["name"], scale.current["metadata"]
        note = f"; {held.note}" if held.note else ""
        events.append(Event("Normal", "RoleScaled", f"{scale.role} replicas {sizes[scale.role]} -> {scale.wanted}: "
                                                    f"InferencePoolRole {name} was scaled (kubectl scale, an "
                                                    f"autoscaler){note}"))
        new = _status(pool, scale.role, held.note) | {"observedGeneration": meta.get("generation")}
        step = _changed(scale.role, name, scale.current.get("status") or {}, new)
        if step.writes:
            steps.append(step)
    change = None
    mirrored = {("spec", str(role), "replicas"): held.replicas[role] for role in Role
                if held.refusal is None and held.replicas[role] != sizes[role]}
    if mirrored:
        said = ", ".join(f"{path[1]} {sizes[Role(path[1])]} -> {value}" for path, value in mirrored.items())
        change = patch(pool, mirrored, why=f"scaled through InferencePoolRole: {said}")
    return RoleScalePlan(steps=tuple(steps), pool_change=change, events=tuple(events), results=tuple(results))


def _band(pool: Mapping[str, Any]) -> RatioBand | None:
    raw = ((pool.get("spec") or {}).get("scaling") or {}).get("ratio")
    try:
        return RatioBand.model_validate(raw) if raw else None
    except ValidationError:
        return None  # the apiserver admitted it, so this pdfleet is older than the pool's API: hold no band


def _scaled(pool: Mapping[str, Any], role: Role, current: Mapping[str, Any]) -> _Scale | None:
    meta, status = current["metadata"], current.get("status") or {}
    wanted = int((current.get("spec") or {}).get("replicas", 0))
    if wanted != _replicas(pool, role) and status.get("observedGeneration") != meta.get("generation"):
        return _Scale(role, current, wanted)
    return None


def _refuse(pool: Mapping[str, Any], scale: _Scale, refusal: str, steps: list[RoleStep], events: list[Event],
            results: list[tuple[Role, str]]) -> None:
    """A scale not taken: said in the status (once as an Event), its observedGeneration left behind."""
    status = scale.current.get("status") or {}
    name = scale.current["metadata"]["name"]
    new = _status(pool, scale.role, refusal)
    if status.get("observedGeneration") is not None:
        new["observedGeneration"] = status["observedGeneration"]
    if status.get("message") != refusal:  # said, and counted, once per refused scale
        events.append(Event("Warning", "ScaleRefused", f"InferencePoolRole {name}: {refusal}"))
        results.append((scale.role, Result.REFUSED))
    step = _changed(scale.role, name, status, new)
    if step.writes:
        steps.append(step)


def _mirror(pool: Mapping[str, Any], role: Role, current: Mapping[str, Any]) -> RoleStep:
    """An InferencePoolRole not scaled since the last mirror: the pool's replicas (when a person changed them)
    and the status."""
    meta, status = current["metadata"], current.get("status") or {}
    held = _replicas(pool, role)
    if int((current.get("spec") or {}).get("replicas", 0)) != held:
        return RoleStep(role, meta["name"], replicas=held, resource_version=meta.get("resourceVersion"),
                        status=_status(pool, role, None))
    return _changed(role, meta["name"], status, _status(pool, role, None) | {"observedGeneration":
                                                                            meta.get("generation")})


def _changed(role: Role, name: str, current: Mapping[str, Any], new: Body) -> RoleStep:
    """A status step when `new` differs from what the InferencePoolRole says; an empty step otherwise."""
    if all(current.get(k) == v for k, v in new.items()) and set(current) <= set(new):
        return RoleStep(role, name)
    observed = new.pop("observedGeneration", None)
    return RoleStep(role, name, status=new, observed_generation=observed)
