"""Which patches a pool's engines run: the spec as declared, resolved against the catalogue's recommendations and
what the pool runs already. Pure.

`spec.engine.patchPolicy` Recommended (the default) runs the catalogue's recommended fixes for the pool's
sglangVersion plus the patches listed; Explicit runs exactly the patches listed. The set a Recommended pool was
given is kept in `status.patches` with a hash of the declared engine-shaping spec it was chosen for (`for_spec`),
and holds while that hash does: an operator upgrade that recommends more never restarts a pool by itself. The
new fixes are `held` (in the status and a Warning Event) and roll out with the pool's next engine-shaping change,
verified like any other. A pool an operator from before patch policies rolled out (a status with a revision and
no `patches`) keeps the patches it lists, exactly as that operator ran them, on the same terms.

Everything downstream (the revision, the rendered pods, the rollout) reads the resolved spec, whose
`engine.patches` is the effective set and whose policy is Explicit, so resolving it again changes nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

from pdfleet.operator.api import checks
from pdfleet.operator.api.engine import PatchPolicy
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import InferencePoolStatus, PatchStatus
from pdfleet.operator.planning import status_writes
from pdfleet.operator.planning.plan import Event
from pdfleet.operator.render import revision
from pdfleet.runtime.patches import catalogue

HELD = "RecommendedPatchesHeld"
OPTED_OUT = "RecommendedPatchesOptedOut"


@dataclasses.dataclass(frozen=True)
class Resolution:
    spec: InferencePoolSpec  # the declared spec with engine.patches the effective set (policy Explicit)
    status: PatchStatus


def declared_digest(declared: InferencePoolSpec) -> str:
    """A hash of what the pool declares that shapes an engine, its patch policy included."""
    text = f"{revision.pool_revision(declared)}/{declared.engine.patch_policy}"
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def resolve(declared: InferencePoolSpec, previous: InferencePoolStatus) -> Resolution:
    """The effective patch set for `declared`, given what the pool's status said before (see the module doc)."""
    engine = declared.engine
    recommended = catalogue.recommended_for(engine.sglang_version)
    listed = tuple(engine.patches)
    for_spec = declared_digest(declared)
    kept = previous.patches
    explicit = engine.patch_policy is PatchPolicy.EXPLICIT
    if explicit:
        effective = listed
    elif kept is not None and kept.policy is PatchPolicy.RECOMMENDED and kept.for_spec == for_spec:
        effective = tuple(kept.effective)
    elif kept is None and previous.update_revision is not None \
            and previous.update_revision == revision.pool_revision(declared):
        effective = listed  # rolled out by an operator before patch policies: exactly what it lists
    else:
        wanted = {*recommended, *listed}
        effective = tuple(patch.id for patch in catalogue.CATALOGUE if patch.id in wanted)
    missing = tuple(pid for pid in recommended if pid not in effective)
    status = PatchStatus(policy=engine.patch_policy, effective=effective, recommended=recommended,
                         held=() if explicit else missing, opted_out=missing if explicit else (), for_spec=for_spec)
    if effective == listed and explicit:
        return Resolution(declared, status)
    resolved_engine = engine.model_copy(update={"patches": effective, "patch_policy": PatchPolicy.EXPLICIT})
    return Resolution(declared.model_copy(update={"engine": resolved_engine}), status)


def validated(pool: Mapping[str, Any]) -> tuple[InferencePoolSpec | None, list[checks.Problem]]:
    """`checks.validate_pool(pool)` with the patch set resolved against the pool's status, as the operator
    resolves it (for readers outside a reconcile: the CLI, a rollback's record)."""
    spec, problems = checks.validate_pool(pool)
    if spec is None:
        return None, problems
    return resolve(spec, status_writes.parse_status(pool.get("status"))).spec, problems


def events(name: str, now: PatchStatus, before: PatchStatus | None) -> list[Event]:
    """A Warning when the recommended fixes a pool runs without change (held after an upgrade, or opted out)."""
    out = []
    about = (("InferencePool", name),)
    if now.held and (before is None or tuple(before.held) != tuple(now.held)):
        out.append(Event("Warning", HELD, f"the engines run without the recommended fixes {', '.join(now.held)}: "
                         "they became recommended after this pool's engines were rolled out, and roll out with the "
                         "next change of its engine-shaping spec (or list them in spec.engine.patches now)",
                         about=about))
    if now.opted_out and (before is None or tuple(before.opted_out) != tuple(now.opted_out)):
        out.append(Event("Warning", OPTED_OUT, f"spec.engine.patchPolicy is Explicit: the engines run without the "
                         f"recommended fixes {', '.join(now.opted_out)}, so their TP ranks can desync in those "
                         "collectives and hang (docs/desync-audit.md)", about=about))
    return out
