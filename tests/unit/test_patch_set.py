"""The patch set a pool's engines run: the recommended fixes by default, exactly the list when opted out, and a
running pool's set held across an operator upgrade until its engine-shaping spec changes (planning/patch_set.py)."""

from __future__ import annotations

import datetime

import pytest

from pdfleet.operator.api import checks
from pdfleet.operator.api.engine import PatchPolicy
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import GateState, InferencePoolStatus, PatchStatus, Verdict
from pdfleet.operator.cache import Observed
from pdfleet.operator.cli import report as report_cli
from pdfleet.operator.planning import patch_set, reconcile
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.renders import Renders
from pdfleet.operator.planning.rollout import verification
from pdfleet.operator.render import revision
from pdfleet.runtime.health import report
from pdfleet.runtime.patches import catalogue
from tests.support.pools import example, pool_body

NOW = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.UTC)
DESYNC_FIXES = ("kv-poll-lockstep", "abort-consensus", "health-check-consensus", "retraction-consensus",
                "admission-consensus", "flush-consensus", "grammar-consensus")


def spec_of(**engine: object) -> InferencePoolSpec:
    body = example("minimal")["spec"]
    return InferencePoolSpec.model_validate({**body, "engine": {**body["engine"], **engine}})


def test_the_recommended_set_is_every_desync_fix_that_applies_and_nothing_that_changes_a_layout_or_a_model() -> None:
    assert catalogue.recommended_for("0.5.23") == DESYNC_FIXES
    # 0.5.7 also gets the batch-decode fix it needs; 0.5.8 fixed it upstream.
    assert catalogue.recommended_for("0.5.7") == (*DESYNC_FIXES, "dsml-batch-decode-guard")
    assert catalogue.recommended_for("0.6.0") == ()
    assert catalogue.recommended_for("not a version") == ()
    for pid in catalogue.recommended_for("0.5.23"):
        patch = catalogue.BY_ID[pid]
        assert not patch.kv_layout and not patch.unavailable and "0.5.23" in patch.applies_to


def test_a_new_pool_that_names_no_patches_runs_the_recommended_set() -> None:
    resolution = patch_set.resolve(spec_of(), InferencePoolStatus())
    assert resolution.spec.engine.patches == DESYNC_FIXES
    assert resolution.status.policy is PatchPolicy.RECOMMENDED
    assert resolution.status.effective == DESYNC_FIXES and resolution.status.held == ()
    assert resolution.status.opted_out == ()


def test_patches_listed_under_recommended_are_added_in_catalogue_order() -> None:
    resolution = patch_set.resolve(spec_of(patches=["dsml-leak-guard", "abort-consensus"]), InferencePoolStatus())
    assert resolution.spec.engine.patches == (*DESYNC_FIXES, "dsml-leak-guard")


@pytest.mark.effect("spec.engine.patchPolicy")
def test_explicit_runs_exactly_the_list_and_says_what_it_runs_without() -> None:
    resolution = patch_set.resolve(spec_of(patchPolicy="Explicit", patches=["abort-consensus"]),
                                   InferencePoolStatus())
    assert resolution.spec.engine.patches == ("abort-consensus",)
    assert resolution.status.opted_out == tuple(p for p in DESYNC_FIXES if p != "abort-consensus")
    assert resolution.status.held == ()
    [event] = patch_set.events("pool", resolution.status, None)
    assert (event.type, event.reason) == ("Warning", patch_set.OPTED_OUT)
    assert "kv-poll-lockstep" in event.message and "abort-consensus," not in event.message
    # Said once: the same status before says nothing new.
    assert patch_set.events("pool", resolution.status, resolution.status) == []


def test_an_explicit_empty_list_opts_out_of_everything() -> None:
    resolution = patch_set.resolve(spec_of(patchPolicy="Explicit"), InferencePoolStatus())
    assert resolution.spec.engine.patches == () and resolution.status.opted_out == DESYNC_FIXES


def test_the_set_a_pool_was_given_holds_while_its_engine_shaping_spec_does() -> None:
    """An operator upgrade that recommends more (here: a status written by an operator that recommended less)
    changes nothing until the spec changes; then the rollout that change makes carries the fixes."""
    spec = spec_of()
    before = PatchStatus(policy=PatchPolicy.RECOMMENDED, effective=DESYNC_FIXES[:2], recommended=DESYNC_FIXES[:2],
                         for_spec=patch_set.declared_digest(spec))
    held = patch_set.resolve(spec, InferencePoolStatus(patches=before))
    assert held.spec.engine.patches == DESYNC_FIXES[:2]
    assert held.status.held == DESYNC_FIXES[2:]
    [event] = patch_set.events("pool", held.status, before)
    assert (event.type, event.reason) == ("Warning", patch_set.HELD)
    # Replicas do not shape an engine: still held.
    scaled = spec.model_copy(update={"decode": spec.decode.model_copy(update={"replicas": 5})})
    assert patch_set.resolve(scaled, InferencePoolStatus(patches=before)).spec.engine.patches == DESYNC_FIXES[:2]
    # An engine-shaping change resolves afresh.
    changed = spec_of(extraArgs=["--max-running-requests=64"])
    assert patch_set.resolve(changed, InferencePoolStatus(patches=before)).spec.engine.patches == DESYNC_FIXES


def test_a_pool_rolled_out_before_patch_policies_keeps_its_list_and_its_revision() -> None:
    """Upgrading to the operator with patch policies restarts no pool: a status with a revision and no `patches`
    is a pool an older operator rolled out with exactly the patches it lists."""
    for name in ("minimal", "deepseek-v32-sm120"):
        declared = InferencePoolSpec.model_validate(example(name)["spec"])
        old = revision.pool_revision(declared)
        resolution = patch_set.resolve(declared, InferencePoolStatus(update_revision=old))
        assert resolution.spec.engine.patches == declared.engine.patches
        assert revision.pool_revision(resolution.spec) == old
        assert resolution.status.held == tuple(p for p in DESYNC_FIXES if p not in declared.engine.patches)
    # A spec changed while no operator ran (its revision is not the status's) is resolved afresh.
    declared = spec_of(extraArgs=["--max-running-requests=64"])
    stale = revision.pool_revision(spec_of())
    assert patch_set.resolve(declared, InferencePoolStatus(update_revision=stale)).spec.engine.patches == DESYNC_FIXES


def test_how_the_set_was_chosen_is_not_a_revision_the_set_is() -> None:
    recommended = patch_set.resolve(spec_of(), InferencePoolStatus()).spec
    explicit = patch_set.resolve(spec_of(patchPolicy="Explicit", patches=list(DESYNC_FIXES)),
                                 InferencePoolStatus()).spec
    bare = patch_set.resolve(spec_of(patchPolicy="Explicit"), InferencePoolStatus()).spec
    assert revision.pool_revision(recommended) == revision.pool_revision(explicit)
    assert revision.pool_revision(recommended) != revision.pool_revision(bare)


def test_resolving_a_resolved_spec_changes_nothing() -> None:
    first = patch_set.resolve(spec_of(), InferencePoolStatus()).spec
    assert patch_set.resolve(first, InferencePoolStatus()).spec.engine.patches == first.engine.patches


@pytest.mark.effect("spec.engine.patchPolicy", "spec.engine.patches")
@pytest.mark.parametrize("patches", [[], ["dsml-leak-guard"]])
def test_a_planned_pool_renders_the_effective_set_and_writes_it_in_its_status(patches: list[str]) -> None:
    pool = pool_body(engine__patches=patches)
    plan = reconcile.plan(pool, Observed(pool=pool, owned={}), now=NOW, renders=Renders())
    pods = [o for o in plan.apply if o["kind"] == "Pod"]
    assert pods
    for pod in pods:
        args = pod["spec"]["containers"][0]["args"]
        effective = patch_set.resolve(spec_of(patches=patches), InferencePoolStatus()).status.effective
        assert [a for a in args if a.startswith("--patch=")] == [f"--patch={p}" for p in effective]
    assert plan.status is not None
    effective = plan.status["patches"]["effective"]
    assert effective[:len(DESYNC_FIXES)] == list(DESYNC_FIXES)
    assert plan.status["patches"]["policy"] == "Recommended"
    # A second plan over the status the first wrote keeps the set and writes nothing new about it.
    written = {**pool, "status": plan.status}
    again = reconcile.plan(written, Observed(pool=written, owned={}), now=NOW, renders=Renders())
    assert again.status is None or again.status.get("patches") == plan.status["patches"]
    assert not [e for e in again.events if e.reason in (patch_set.HELD, patch_set.OPTED_OUT)]


def test_readers_outside_a_reconcile_get_the_resolved_set_not_the_declared_one() -> None:
    pool = pool_body()
    spec, problems = patch_set.validated(pool)
    assert not problems and spec is not None and spec.engine.patches == DESYNC_FIXES
    assert checks.validate_pool(pool)[0].engine.patches == ()  # what the pool declares


def _health(*sets: tuple[str, ...] | None) -> GroupHealth:
    return GroupHealth(Verdict.HEALTHY, "event_loop_normal_disagg_decode", "", 2, answered=True,
                       patch_sets=frozenset(s for s in sets if s is not None),
                       patches_unsaid=any(s is None for s in sets))


@pytest.mark.effect("spec.rollout.verification.patches")
def test_the_patches_gate_passes_only_when_every_pod_reports_the_resolved_set() -> None:
    gate = verification._patches_gate
    assert gate(DESYNC_FIXES, _health(tuple(reversed(DESYNC_FIXES))), True).state is GateState.PASSED
    failed = gate(DESYNC_FIXES, _health(DESYNC_FIXES[:2]), True)
    assert failed.state is GateState.FAILED and "seen kv-poll-lockstep, abort-consensus" in failed.message
    assert gate(DESYNC_FIXES, _health(DESYNC_FIXES, ()), True).state is GateState.FAILED  # pods disagree
    assert gate(DESYNC_FIXES, _health(DESYNC_FIXES), False).state is GateState.WAITING  # not the current pods
    older = gate(DESYNC_FIXES, _health(None), True)
    assert older.state is GateState.SKIPPED and "older" in older.message


def test_an_agent_report_carries_the_patches_and_a_malformed_list_is_no_report() -> None:
    built = report.build([], now_ns=1, ledger="/l", alive=lambda r: True, patches=("abort-consensus",))
    assert report.from_json(report.to_json(built)).patches == ("abort-consensus",)
    assert report.from_json(report.to_json(report.build([], now_ns=1, ledger="/l", alive=bool))).patches is None
    with pytest.raises(ValueError, match="patches"):
        report.from_json({**report.to_json(built), "patches": "abort-consensus"})


def test_pdfleet_status_names_what_a_pool_runs_without() -> None:
    explicit = PatchStatus(policy=PatchPolicy.EXPLICIT, effective=("abort-consensus",), recommended=DESYNC_FIXES,
                           opted_out=DESYNC_FIXES[:1])
    assert report_cli.patches_line(InferencePoolStatus(patches=explicit)) == (
        "Patches:    abort-consensus (Explicit); opted out of recommended kv-poll-lockstep")
    held = PatchStatus(policy=PatchPolicy.RECOMMENDED, effective=(), recommended=DESYNC_FIXES[:2],
                       held=DESYNC_FIXES[:2])
    assert report_cli.patches_line(InferencePoolStatus(patches=held)) == (
        "Patches:    none (Recommended); recommended kv-poll-lockstep, abort-consensus held until the next "
        "engine-shaping change")


def test_a_status_that_moves_without_moving_the_set_keeps_the_renders_made_for_it() -> None:
    renders = Renders()
    pool = pool_body()
    first = reconcile.plan(pool, Observed(pool=pool, owned={}), now=NOW, renders=renders)
    spec, _ = renders.validated(pool)
    assert first.status is not None
    moved = {**pool, "status": {**first.status, "updateRevision": "elsewhere"}}
    again, _ = renders.validated(moved)
    assert again is spec, "the same set: the spec object the renders are kept by is the same"
    misses = renders.counts.desired_misses
    reconcile.plan(moved, Observed(pool=moved, owned={}), now=NOW, renders=renders)
    assert renders.counts.desired_misses == misses
