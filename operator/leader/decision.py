"""Leader election decisions, pure: given the Lease as observed, the time, this replica's identity and the
timings, whether to create, acquire, renew or stand by, and the Lease record to write.

client-go's semantics (k8s.io/client-go/tools/leaderelection): a replica never compares another machine's
`renewTime` with its own clock. It notes, on its own monotonic clock, when it last saw the Lease record change;
a holder that has not renewed for `leaseDurationSeconds` of *that* clock has lost the Lease. So clock skew
between replicas does not matter, only the rate of their clocks.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

API_VERSION = "coordination.k8s.io/v1"
# client-go's minimum ratio of the renew deadline to the retry period, so the leader gets a few attempts in.
JITTER_FACTOR = 1.2
# A standby retries every retry period plus up to this fraction of it, so that standbys do not retry in step.
STANDBY_JITTER = 0.2
# A released Lease (graceful shutdown) expires this fast, so a standby takes over on its next retry.
RELEASED_LEASE_SECONDS = 1


@dataclasses.dataclass(frozen=True)
class Timings:
    lease_duration: float = 15.0  # how long a standby waits, after the last renewal it saw, to take over
    renew_deadline: float = 10.0  # how long the leader keeps trying to renew before it gives up leading
    retry_period: float = 2.0  # between attempts, leader and standby alike

    def validate(self) -> None:
        """client-go's checks: the leader must give up (renew deadline) before a standby may take over
        (lease duration), and must get a few attempts in before it gives up."""
        if min(self.lease_duration, self.renew_deadline, self.retry_period) <= 0:
            raise ValueError("the lease duration, renew deadline and retry period must all be positive")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError(f"the lease duration ({self.lease_duration:g}s) must be greater than the renew "
                             f"deadline ({self.renew_deadline:g}s)")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise ValueError(f"the renew deadline ({self.renew_deadline:g}s) must be greater than "
                             f"{JITTER_FACTOR:g} x the retry period ({self.retry_period:g}s)")


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """The election's part of a Lease: its spec, and the resourceVersion a write must be conditional on."""

    holder: str = ""  # empty: nobody holds it (released)
    lease_duration_seconds: int = 0
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0
    resource_version: str | None = None


@dataclasses.dataclass(frozen=True)
class Observation:
    """The record last read, and when (this replica's monotonic clock) it was first seen as it is."""

    record: LeaseRecord | None
    since: float


class Action(enum.Enum):
    CREATE = "create"  # no Lease yet: create it, held by us
    ACQUIRE = "acquire"  # the Lease is free or expired: take it over
    RENEW = "renew"  # we hold it: renew it
    STANDBY = "standby"  # another replica holds it and has renewed recently


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    record: LeaseRecord | None  # what to write; None to stand by
    holder: str  # who holds the Lease after this decision, as far as we know


def observe(previous: Observation | None, record: LeaseRecord | None, now: float) -> Observation:
    """A changed record (a renewal, a new holder) restarts the holder's lease on our clock; an unchanged one
    keeps the moment we first saw it."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record=record, since=now)


def held_by_another(observation: Observation, identity: str, now: float) -> bool:
    record = observation.record
    return (record is not None and record.holder not in ("", identity)
            and now < observation.since + record.lease_duration_seconds)


def until_expiry(observation: Observation, identity: str, now: float) -> float | None:
    """Seconds until another holder's lease runs out on our clock; None when nobody else holds it. A standby
    retries then rather than up to a retry period later, so a dead leader is replaced as soon as allowed."""
    if not held_by_another(observation, identity, now):
        return None
    assert observation.record is not None
    return observation.since + observation.record.lease_duration_seconds - now


def decide(observation: Observation, *, identity: str, now: float, wall: datetime, timings: Timings) -> Decision:
    """client-go's tryAcquireOrRenew: create a missing Lease, renew our own, take over a free or expired one,
    else stand by. `now` is the monotonic clock of `observation`; `wall` goes into the Lease."""
    record = observation.record
    duration = max(1, round(timings.lease_duration))
    if record is None:
        return Decision(Action.CREATE, LeaseRecord(holder=identity, lease_duration_seconds=duration,
                                                   acquire_time=wall, renew_time=wall), identity)
    if held_by_another(observation, identity, now):
        return Decision(Action.STANDBY, None, record.holder)
    if record.holder == identity:
        renewed = dataclasses.replace(record, lease_duration_seconds=duration, renew_time=wall)
        return Decision(Action.RENEW, renewed, identity)
    acquired = dataclasses.replace(record, holder=identity, lease_duration_seconds=duration, acquire_time=wall,
                                   renew_time=wall, transitions=record.transitions + 1)
    return Decision(Action.ACQUIRE, acquired, identity)


def released(record: LeaseRecord, wall: datetime) -> LeaseRecord:
    """The record a leader writes on graceful shutdown: nobody holds it, so a standby takes over at once."""
    return dataclasses.replace(record, holder="", lease_duration_seconds=RELEASED_LEASE_SECONDS,
                               acquire_time=wall, renew_time=wall)


def renew_deadline_passed(last_renewed: float, now: float, timings: Timings) -> bool:
    """`last_renewed`: when the last successful renewal was *sent* (monotonic). Measuring from the send, not
    the answer, keeps the leader's deadline ahead of any standby's view of the same renewal."""
    return now - last_renewed >= timings.renew_deadline


def _micro_time(value: datetime | None) -> str | None:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if value else None


def _parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def parse(lease: Mapping[str, Any]) -> LeaseRecord:
    """The record of a Lease as the API returns it; fields another tool left out read as empty."""
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or "",
        lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=_parse_time(spec.get("acquireTime")),
        renew_time=_parse_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=(lease.get("metadata") or {}).get("resourceVersion"),
    )


def lease_body(namespace: str, name: str, record: LeaseRecord) -> dict[str, Any]:
    """The Lease to create or update; an update carries the resourceVersion it read, so that of two replicas
    racing for the same Lease exactly one wins (the other gets 409 Conflict)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if record.resource_version:
        metadata["resourceVersion"] = record.resource_version
    return {
        "apiVersion": API_VERSION,
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": record.holder,
            "leaseDurationSeconds": record.lease_duration_seconds,
            "acquireTime": _micro_time(record.acquire_time),
            "renewTime": _micro_time(record.renew_time),
            "leaseTransitions": record.transitions,
        },
    }
