"""Rollback, undo and pause: the last verified spec kept on the pool, the decision that follows a failed gate
(table of states -> next step), the walk of a whole rollback through the real planner, and a paused rollout."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

from pdfleet.operator.api.conditions import Condition, ConditionStatus, ConditionType
from pdfleet.operator.api.status import InferencePoolStatus
from pdfleet.operator.cli import report
from pdfleet.operator.planning import patch_set, spec_change
from pdfleet.operator.planning.rollout import rollback
from pdfleet.operator.planning.rollout.rollback import Action
from pdfleet.operator.planning.rollout.verification import RolloutVerified
from pdfleet.operator.render import revision
from tests.support.pools import NO_BAKE, pool_body
from tests.unit.test_planning import NOW, FakeCluster
from tests.unit.test_verification import NORMAL_DECODE, OVERLAP_DECODE, condition, events, group

Body = dict[str, Any]
FAILED = RolloutVerified(ConditionStatus.FALSE, "GateFailed", "gate eventLoop failed for decode group tiny-decode-0 "
                                                              "at revision r2: expected a, seen b")


def change_spec(cluster: FakeCluster, **engine: Any) -> None:
    """A person's edit of spec.engine: the apiserver moves the generation."""
    cluster.pool["spec"]["engine"].update(engine)
    cluster.pool["metadata"]["generation"] += 1


def verified_cluster(*, auto_rollback: bool = True, prefill: int = 1, decode: int = 2) -> FakeCluster:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=prefill, decode=decode,
                                     rollout__autoRollback=auto_rollback))
    cluster.converge()
    return cluster


def revision_of(pool: Body) -> str:
    spec, _ = patch_set.validated(pool)
    assert spec is not None
    return revision.pool_revision(spec)


def annotation(cluster: FakeCluster, key: str) -> Body | None:
    raw = (cluster.pool["metadata"].get("annotations") or {}).get(key)
    return json.loads(raw) if raw else None


def pod_names(cluster: FakeCluster, group_name: str) -> list[str]:
    return sorted(n for (k, n), o in cluster.owned.items() if k == "Pod" and o["metadata"]["labels"].get(
        "pdfleet.dev/group") == group_name)


# --- the record -----------------------------------------------------------------------------------------------


def test_the_verified_spec_is_recorded_once_the_revision_is_verified_and_restores_that_revision() -> None:
    cluster = FakeCluster(pool_body(prefill=1, decode=1))
    cluster.engines = False  # Ready pods, no gate passed: not verified, nothing recorded
    for _ in range(4):
        cluster.step()
    assert annotation(cluster, rollback.VERIFIED_SPEC) is None
    cluster.engines = True
    plans = cluster.converge()
    record = annotation(cluster, rollback.VERIFIED_SPEC)
    assert record is not None and record["revision"] == cluster.pool["status"]["currentRevision"]
    assert sum(len(p.pool_changes) for p in plans) == 1, "written once, not on every reconcile"
    assert "replicas" not in record["spec"]["decode"] and "rollout" not in record["spec"]

    # The record restores exactly its revision, whatever changed since in the engine-shaping sections.
    before = json.loads(json.dumps(cluster.pool))
    change_spec(cluster, overlapSchedule="Disabled", env=[{"name": "X", "value": "1"}])
    cluster.pool["spec"]["decode"]["replicas"] = 3
    target = rollback.recorded(cluster.pool)
    assert target is not None
    change = rollback.restore(cluster.pool, target, cause="Undo", message="m", now=NOW)
    assert change is not None and change.changes_spec
    restored = spec_change.apply(cluster.pool, change)
    assert revision_of(restored) == record["revision"] == revision_of(before)
    assert restored["spec"]["decode"]["replicas"] == 3, "replicas are not the revision's: kept"


# --- the decision after a failed gate (table) -----------------------------------------------------------------


def _failed_status(generation: int, message: str) -> InferencePoolStatus:
    return InferencePoolStatus(conditions=(Condition(
        type=str(ConditionType.ROLLOUT_VERIFIED), status=ConditionStatus.FALSE, observed_generation=generation,
        last_transition_time=NOW, reason="GateFailed", message=message),))


@pytest.mark.parametrize(("rollout", "auto", "record", "on_record", "action", "note"), [
    (RolloutVerified(ConditionStatus.TRUE, "AllGroupsVerified", "ok"), True, "old", True, Action.NONE, ""),
    (RolloutVerified(ConditionStatus.UNKNOWN, "Verifying", "1/2"), True, "old", True, Action.NONE, ""),
    (FAILED, False, "old", True, Action.HOLD, "holding until the spec changes (spec.rollout.autoRollback is off)"),
    (FAILED, True, None, True, Action.HOLD, "autoRollback: no verified revision to return to (the pool never "
                                             "completed a verified rollout); holding until the spec changes"),
    (FAILED, True, "same", True, Action.HOLD, "is itself the last verified one"),
    (FAILED, True, "old", False, Action.WAIT, "autoRollback: returning to the last verified revision"),
    (FAILED, True, "old", True, Action.ROLL_BACK, "autoRollback: returning to the last verified revision"),
], ids=["verified", "verifying", "no-autoRollback", "no-record", "record-is-the-failed-one",
        "failure-not-on-record-yet", "roll-back"])
def test_what_follows_a_rollout_verification(rollout: RolloutVerified, auto: bool, record: str | None,
                                             on_record: bool, action: Action, note: str) -> None:
    old = pool_body(prefill=1, decode=1)
    pool = pool_body(prefill=1, decode=1, generation=2, rollout__autoRollback=auto,
                     engine__overlapSchedule="Disabled")
    spec, _ = patch_set.validated(pool)
    assert spec is not None
    if record is not None:
        source = old if record == "old" else pool
        value = rollback.VerifiedSpec(revision=revision_of(source), spec=rollback.shaping(source["spec"]))
        pool["metadata"]["annotations"] = {rollback.VERIFIED_SPEC: value.model_dump_json()}
    full = f"{rollout.message}; {rollback.decide(pool, spec, InferencePoolStatus(), rollout, NOW).note}"
    previous = _failed_status(2, full) if on_record else InferencePoolStatus()
    decision = rollback.decide(pool, spec, previous, rollout, NOW)
    assert decision.action is action
    assert note in decision.note and (note == "") == (decision.note == "")
    assert (decision.change is not None) == (decision.event is not None) == (action is Action.ROLL_BACK)
    if decision.change is not None and decision.event is not None:
        assert decision.change.ops[0] == {"op": "test", "path": "/metadata/generation", "value": 2}
        assert decision.event.type == "Warning" and decision.event.reason == "RolloutRolledBack"
        assert decision.event.message == (f"rolled back from revision {revision_of(pool)} to the last verified "
                                          f"revision {revision_of(old)}: {FAILED.message}")
        assert revision_of(spec_change.apply(pool, decision.change)) == revision_of(old)


# --- whole walks through the planner --------------------------------------------------------------------------


def test_a_failed_gate_with_auto_rollback_stops_then_returns_to_the_last_verified_revision_verified() -> None:
    cluster = verified_cluster()
    old = cluster.pool["status"]["currentRevision"]
    old_decode_0 = pod_names(cluster, "tiny-decode-0")
    cluster.loops["tiny-decode-0"] = OVERLAP_DECODE  # its new engines report the overlap loop
    change_spec(cluster, overlapSchedule="Disabled")
    new = revision_of(cluster.pool)

    # The failure is on record first: RolloutVerified False, one RolloutGateFailed, phase Failed, spec untouched.
    plans = [cluster.step() for _ in range(3)]
    verified = condition(cluster, "RolloutVerified")
    assert (verified["status"], verified["reason"]) == ("False", "GateFailed")
    assert verified["message"].endswith(f"; autoRollback: returning to the last verified revision {old}")
    assert cluster.pool["status"]["phase"] == "Failed"
    assert len(events(plans, "RolloutGateFailed")) == 1
    assert cluster.pool["spec"]["engine"]["overlapSchedule"] == "Disabled"

    # Then the spec goes back, and the old revision rolls out again through the same verified path.
    plans += cluster.converge(limit=20)
    assert cluster.pool["spec"]["engine"].get("overlapSchedule", "Enabled") == "Enabled"
    [rolled] = events(plans, "RolloutRolledBack")
    assert rolled.startswith(f"rolled back from revision {new} to the last verified revision {old}: gate eventLoop "
                             f"failed for decode group tiny-decode-0") and NORMAL_DECODE in rolled
    why = annotation(cluster, rollback.ROLLED_BACK)
    assert why is not None and (why["cause"], why["from_revision"], why["to_revision"]) == ("GateFailed", new, old)
    assert why["generation"] == cluster.pool["metadata"]["generation"] == 3
    status = cluster.pool["status"]
    assert (status["currentRevision"], status["updateRevision"], status["phase"]) == (old, old, "Ready")
    assert condition(cluster, "RolloutVerified")["status"] == "True"
    assert all(g["verifiedRevision"] == g["revision"] for g in status["groups"])
    assert pod_names(cluster, "tiny-decode-0") == old_decode_0
    assert len(events(plans, "RolloutGateFailed")) == 1, "the failure was announced once"
    assert annotation(cluster, rollback.VERIFIED_SPEC)["revision"] == old  # type: ignore[index]


def test_a_failed_gate_without_auto_rollback_or_any_verified_revision_holds_and_says_so() -> None:
    cluster = verified_cluster(auto_rollback=False)
    cluster.loops["tiny-decode-0"] = OVERLAP_DECODE
    change_spec(cluster, overlapSchedule="Disabled")
    plans = cluster.converge(limit=10)
    assert not events(plans, "RolloutRolledBack") and cluster.pool["spec"]["engine"]["overlapSchedule"] == "Disabled"
    assert condition(cluster, "RolloutVerified")["message"].endswith("(spec.rollout.autoRollback is off)")

    # A new pool whose very first revision fails has nothing to return to.
    fresh = FakeCluster(pool_body(**NO_BAKE, prefill=1, decode=1, rollout__autoRollback=True))
    fresh.loops["tiny-decode-0"] = NORMAL_DECODE  # the overlap loop is expected
    plans = fresh.converge(limit=10)
    assert not events(plans, "RolloutRolledBack") and fresh.pool["status"]["phase"] == "Failed"
    assert "no verified revision to return to" in condition(fresh, "RolloutVerified")["message"]


@pytest.mark.effect("spec.rollout.autoRollback")
def test_auto_rollback_is_what_decides_between_holding_and_going_back() -> None:
    outcomes = {}
    for auto in (False, True):
        cluster = verified_cluster(auto_rollback=auto, decode=1)
        cluster.loops["tiny-decode-0"] = OVERLAP_DECODE
        change_spec(cluster, overlapSchedule="Disabled")
        cluster.converge(limit=20)
        outcomes[auto] = cluster.pool["status"]["phase"], cluster.pool["metadata"]["generation"]
    assert outcomes == {False: ("Failed", 2), True: ("Ready", 3)}


@pytest.mark.effect("spec.rollout.paused")
def test_a_paused_rollout_starts_no_replacement_lets_the_one_in_flight_finish_and_resumes() -> None:
    cluster = verified_cluster(auto_rollback=False, decode=2)
    change_spec(cluster, overlapSchedule="Disabled")
    first = cluster.step()  # the first decode group is replaced
    assert [r.name for r in first.delete] == ["tiny-decode-0-0"]
    cluster.pool["spec"]["rollout"]["paused"] = True
    cluster.pool["metadata"]["generation"] += 1
    plans = cluster.converge(limit=10)
    assert not [r for p in plans for r in p.delete], "nothing more replaced"
    assert group(cluster, "tiny-decode-0")["verifiedRevision"] == group(cluster, "tiny-decode-0")["revision"], \
        "the replacement in flight finished and was verified"
    progressing = condition(cluster, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("Unknown", "Paused")
    assert progressing["message"].startswith("rollout paused (spec.rollout.paused): 2 group(s) of an older revision")

    del cluster.pool["spec"]["rollout"]["paused"]
    cluster.pool["metadata"]["generation"] += 1
    cluster.converge(limit=20)
    assert condition(cluster, "RolloutVerified")["status"] == "True"
    assert condition(cluster, "Progressing")["reason"] == "Stable"


def test_a_revision_verified_then_gone_bad_can_be_undone_to_the_one_before_from_the_history() -> None:
    """The outage that motivated the history: the bad revision was verified (its gates passed before it broke),
    so the last verified revision was the bad one and undo had nowhere to go."""
    cluster = verified_cluster(auto_rollback=False)
    first = cluster.pool["status"]["currentRevision"]
    change_spec(cluster, overlapSchedule="Disabled")
    cluster.converge(limit=20)
    second = cluster.pool["status"]["currentRevision"]
    assert second != first
    entries = rollback.history(cluster.pool)
    assert [e.revision for e in entries] == [first, second] and all(e.at for e in entries)
    lines = report.history_lines(cluster.pool)
    assert lines[0].split() == ["REVISION", "VERIFIED", "AT", "GENERATION"]
    assert lines[1].startswith(first) and lines[2].startswith(second) and lines[2].endswith("current")

    assert rollback.undo_target(cluster.pool).revision == first, "the newest verified one the pool does not run"
    change = rollback.undo(cluster.pool, NOW + datetime.timedelta(minutes=5))
    cluster.pool = spec_change.apply(cluster.pool, change)
    cluster.pool["metadata"]["generation"] += 1
    assert revision_of(cluster.pool) == first
    cluster.converge(limit=20)
    # Verified again, it moves to the end of the history; --to-revision names any entry, and only those.
    assert [e.revision for e in rollback.history(cluster.pool)] == [second, first]
    assert rollback.undo_target(cluster.pool, second).revision == second
    with pytest.raises(rollback.NothingToUndo, match="no verified revision nope in its history"):
        rollback.undo(cluster.pool, NOW, "nope")
    with pytest.raises(rollback.NothingToUndo, match=f"already has revision {first}"):
        rollback.undo(cluster.pool, NOW, first)


def test_the_history_keeps_the_newest_verified_revisions_only() -> None:
    cluster = verified_cluster(auto_rollback=False, decode=1)
    for n in range(rollback.HISTORY_LIMIT + 2):
        change_spec(cluster, env=[{"name": "ROUND", "value": str(n)}])
        cluster.converge(limit=20)
    entries = rollback.history(cluster.pool)
    assert len(entries) == rollback.HISTORY_LIMIT
    assert entries[-1].revision == cluster.pool["status"]["currentRevision"]


def test_undo_goes_back_to_the_last_verified_revision_or_says_why_it_cannot() -> None:
    fresh = pool_body(prefill=1, decode=1)
    with pytest.raises(rollback.NothingToUndo, match="has no verified revision recorded"):
        rollback.undo(fresh, NOW)
    cluster = verified_cluster(auto_rollback=False)
    with pytest.raises(rollback.NothingToUndo, match="already has the last verified revision"):
        rollback.undo(cluster.pool, NOW)
    old = cluster.pool["status"]["currentRevision"]
    change_spec(cluster, overlapSchedule="Disabled")
    change = rollback.undo(cluster.pool, NOW + datetime.timedelta(seconds=5))
    cluster.pool = spec_change.apply(cluster.pool, change)
    cluster.pool["metadata"]["generation"] += 1
    assert revision_of(cluster.pool) == old
    why = annotation(cluster, rollback.ROLLED_BACK)
    assert why is not None and why["cause"] == "Undo" and why["to_revision"] == old
    cluster.converge(limit=20)
    assert cluster.pool["status"]["currentRevision"] == old
