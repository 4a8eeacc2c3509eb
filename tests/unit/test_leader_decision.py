"""Leader election decisions (pure): client-go's tryAcquireOrRenew, on this replica's clock only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pdfleet.operator.leader import decision
from pdfleet.operator.leader.decision import Action, LeaseRecord, Observation, Timings

ME, OTHER = "op-a_1234", "op-b_5678"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
TIMINGS = Timings()


def held(holder: str, *, renewed: datetime = T0, transitions: int = 4, rv: str = "7") -> LeaseRecord:
    return LeaseRecord(holder=holder, lease_duration_seconds=15, acquire_time=T0 - timedelta(minutes=5),
                       renew_time=renewed, transitions=transitions, resource_version=rv)


def decide(observation: Observation, now: float, wall: datetime = T0) -> decision.Decision:
    return decision.decide(observation, identity=ME, now=now, wall=wall, timings=TIMINGS)


def test_a_missing_lease_is_created_held_by_us_with_the_lease_duration() -> None:
    choice = decide(decision.observe(None, None, now=100.0), now=100.0)
    assert choice.action is Action.CREATE
    assert choice.record == LeaseRecord(holder=ME, lease_duration_seconds=15, acquire_time=T0, renew_time=T0)


def test_a_lease_another_replica_renewed_recently_is_left_alone() -> None:
    observation = decision.observe(None, held(OTHER), now=100.0)
    choice = decide(observation, now=114.9)
    assert (choice.action, choice.record, choice.holder) == (Action.STANDBY, None, OTHER)


def test_expiry_is_judged_on_our_clock_from_when_we_saw_the_record_not_from_its_renew_time() -> None:
    # The holder's renewTime is an hour in the past (a skewed clock), yet we saw it renew just now.
    skewed = held(OTHER, renewed=T0 - timedelta(hours=1))
    observation = decision.observe(None, skewed, now=100.0)
    assert decide(observation, now=101.0, wall=T0).action is Action.STANDBY
    # Not renewed for the lease duration of our clock: it is ours to take over.
    assert decide(observation, now=115.0).action is Action.ACQUIRE


def test_a_renewal_restarts_the_holders_lease_and_an_unchanged_record_does_not() -> None:
    first = decision.observe(None, held(OTHER, rv="7"), now=100.0)
    same = decision.observe(first, held(OTHER, rv="7"), now=110.0)
    assert same.since == 100.0
    renewed = decision.observe(same, held(OTHER, renewed=T0 + timedelta(seconds=2), rv="8"), now=110.0)
    assert renewed.since == 110.0
    assert decide(renewed, now=120.0).action is Action.STANDBY
    assert decide(same, now=120.0).action is Action.ACQUIRE


def test_a_standby_knows_when_the_holders_lease_runs_out_on_its_clock() -> None:
    observation = decision.observe(None, held(OTHER), now=100.0)
    assert decision.until_expiry(observation, ME, now=104.0) == pytest.approx(11.0)
    assert decision.until_expiry(observation, ME, now=115.0) is None  # expired: nobody else holds it
    assert decision.until_expiry(decision.observe(None, held(ME), now=100.0), ME, now=101.0) is None
    assert decision.until_expiry(decision.observe(None, None, now=100.0), ME, now=101.0) is None


def test_taking_over_an_expired_lease_counts_a_transition_and_keeps_the_resource_version() -> None:
    observation = decision.observe(None, held(OTHER, transitions=4, rv="7"), now=100.0)
    wall = T0 + timedelta(seconds=20)
    choice = decide(observation, now=130.0, wall=wall)
    assert choice.action is Action.ACQUIRE
    assert choice.record == LeaseRecord(holder=ME, lease_duration_seconds=15, acquire_time=wall, renew_time=wall,
                                        transitions=5, resource_version="7")


def test_a_released_lease_is_taken_at_once() -> None:
    free = decision.released(held(OTHER), T0)
    assert (free.holder, free.lease_duration_seconds) == ("", decision.RELEASED_LEASE_SECONDS)
    choice = decide(decision.observe(None, free, now=100.0), now=100.0)
    assert choice.action is Action.ACQUIRE
    assert choice.record is not None and choice.record.transitions == free.transitions + 1


def test_our_own_lease_is_renewed_keeping_acquire_time_and_transitions() -> None:
    mine = held(ME, transitions=3)
    later = T0 + timedelta(seconds=2)
    choice = decide(decision.observe(None, mine, now=100.0), now=102.0, wall=later)
    assert choice.action is Action.RENEW
    assert choice.record == LeaseRecord(holder=ME, lease_duration_seconds=15, acquire_time=mine.acquire_time,
                                        renew_time=later, transitions=3, resource_version="7")


def test_the_renew_deadline_counts_from_when_the_last_renewal_was_sent() -> None:
    assert not decision.renew_deadline_passed(last_renewed=100.0, now=109.9, timings=TIMINGS)
    assert decision.renew_deadline_passed(last_renewed=100.0, now=110.0, timings=TIMINGS)


@pytest.mark.parametrize(("timings", "message"), [
    (Timings(lease_duration=10, renew_deadline=10, retry_period=2), "must be greater than the renew deadline"),
    (Timings(lease_duration=15, renew_deadline=2, retry_period=2), "1.2 x the retry period"),
    (Timings(lease_duration=15, renew_deadline=10, retry_period=0), "must all be positive"),
])
def test_timings_that_would_let_two_leaders_overlap_are_refused(timings: Timings, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        timings.validate()


def test_the_default_timings_are_client_gos() -> None:
    Timings().validate()
    assert (TIMINGS.lease_duration, TIMINGS.renew_deadline, TIMINGS.retry_period) == (15, 10, 2)


def test_a_lease_round_trips_through_its_api_form_with_micro_time() -> None:
    record = held(ME, renewed=T0 + timedelta(microseconds=123456))
    body = decision.lease_body("pdfleet-system", "pdfleet", record)
    assert body["apiVersion"] == "coordination.k8s.io/v1" and body["kind"] == "Lease"
    assert body["metadata"] == {"name": "pdfleet", "namespace": "pdfleet-system", "resourceVersion": "7"}
    assert body["spec"]["renewTime"] == "2026-01-01T00:00:00.123456Z"
    assert decision.parse(body) == record


def test_a_new_lease_is_created_without_a_resource_version_and_a_sparse_one_parses_as_free() -> None:
    body = decision.lease_body("ns", "name", LeaseRecord(holder=ME, lease_duration_seconds=15))
    assert "resourceVersion" not in body["metadata"]
    assert decision.parse({"metadata": {"resourceVersion": "1"}, "spec": {}}) == LeaseRecord(resource_version="1")
