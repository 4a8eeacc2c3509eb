"""The election loop against an in-memory Lease with the apiserver's optimistic concurrency: one leader, a
standby that writes nothing, a leader that gives up within the renew deadline, and a fast release."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from pdfleet.operator import metrics
from pdfleet.operator.kube.kube_client import KubeError
from pdfleet.operator.leader.decision import LeaseRecord, Timings
from pdfleet.operator.leader.elector import LeaderElector
from pdfleet.operator.leader.lease import LeaseStore

FAST = Timings(lease_duration=1.0, renew_deadline=0.4, retry_period=0.05)


class MemoryLease:
    """A LeaseStore stand-in: writes must carry the resourceVersion last written, as the apiserver demands."""

    namespace, name = "pdfleet-system", "pdfleet"

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.down = False  # the apiserver does not answer
        self.writes: list[str] = []  # holder of each successful write
        self.creates = 0  # attempts, successful or not

    def _check(self) -> None:
        if self.down:
            raise KubeError(0, "ConnectionError", "connection refused")

    async def get(self, *, timeout: float) -> LeaseRecord | None:
        self._check()
        record = self.record
        await asyncio.sleep(0)  # a network round trip: another replica may read the same record meanwhile
        return record

    async def create(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None:
        self._check()
        self.creates += 1
        return None if self.record is not None else self._write(record)

    async def update(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None:
        self._check()
        current = self.record.resource_version if self.record else None
        return self._write(record) if record.resource_version == current else None

    def _write(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = dataclasses.replace(record, resource_version=str(self.version))
        self.writes.append(record.holder)
        return self.record


class View:
    """One replica's door to the shared Lease; counts its reads so a test can stop its campaign after some."""

    def __init__(self, lease: MemoryLease) -> None:
        self.lease = lease
        self.namespace, self.name = lease.namespace, lease.name
        self.reads = 0
        self.stop_after: tuple[int, asyncio.Event] | None = None

    async def get(self, *, timeout: float) -> LeaseRecord | None:
        self.reads += 1
        if self.stop_after and self.reads >= self.stop_after[0]:
            self.stop_after[1].set()
        return await self.lease.get(timeout=timeout)

    async def create(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None:
        return await self.lease.create(record, timeout=timeout)

    async def update(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None:
        return await self.lease.update(record, timeout=timeout)


def elector(lease: MemoryLease, identity: str) -> LeaderElector:
    store: LeaseStore = View(lease)  # type: ignore[assignment]  # same interface, in memory
    return LeaderElector(store, identity, FAST)


async def campaign(candidate: LeaderElector, reads: int) -> bool:
    """Runs `candidate`'s campaign for at most `reads` reads of the Lease; whether it won."""
    stop = asyncio.Event()
    candidate.store.stop_after = (reads, stop)  # type: ignore[attr-defined]
    return await candidate.acquire(stop)


async def test_one_replica_leads_and_the_other_stands_by_writing_nothing() -> None:
    lease = MemoryLease()
    a, b = elector(lease, "a"), elector(lease, "b")
    assert await a.acquire(asyncio.Event())
    assert a.is_leader and metrics.REGISTRY.get_sample_value("pdfleet_leader_is_leader") == 1
    holding = asyncio.create_task(a.hold())
    try:
        assert not await campaign(b, reads=10)
    finally:
        holding.cancel()
    assert not b.is_leader and b.holder == "a"
    assert set(lease.writes) == {"a"} and len(lease.writes) >= 2  # created, then renewed while b stood by


async def test_the_leader_gives_up_within_the_renew_deadline_when_it_cannot_renew() -> None:
    lease = MemoryLease()
    a = elector(lease, "a")
    assert await a.acquire(asyncio.Event())
    lease.down = True
    started = time.monotonic()
    reason = await asyncio.wait_for(a.hold(), timeout=5)
    assert "renew deadline" in reason and "connection refused" in reason
    assert time.monotonic() - started < FAST.renew_deadline + 2 * FAST.retry_period
    assert not a.is_leader and metrics.REGISTRY.get_sample_value("pdfleet_leader_is_leader") == 0


async def test_the_leader_stops_at_once_when_another_replica_holds_the_lease() -> None:
    lease = MemoryLease()
    a = elector(lease, "a")
    assert await a.acquire(asyncio.Event())
    assert lease.record is not None
    lease._write(dataclasses.replace(lease.record, holder="b"))  # e.g. a's renewals stalled past the lease
    reason = await asyncio.wait_for(a.hold(), timeout=FAST.renew_deadline)
    assert reason == "the Lease is held by b"


async def test_a_released_lease_is_taken_over_on_the_next_attempt_and_counted_as_a_transition() -> None:
    lease = MemoryLease()
    a, b = elector(lease, "a"), elector(lease, "b")
    assert await a.acquire(asyncio.Event())
    released = released_total()
    await a.release()
    assert lease.record is not None and lease.record.holder == ""
    assert released_total() == released + 1
    assert await campaign(b, reads=2)
    assert lease.record.holder == "b" and lease.record.transitions == 1


async def test_of_two_replicas_racing_for_a_missing_lease_exactly_one_wins() -> None:
    lease = MemoryLease()
    a, b = elector(lease, "a"), elector(lease, "b")
    results = await asyncio.gather(campaign(a, reads=3), campaign(b, reads=3))
    assert sorted(results) == [False, True]
    assert lease.creates == 2  # both read "no Lease" and tried to create it
    assert lease.record is not None and lease.writes == [lease.record.holder]
    # The winner read once; the loser's create was refused and it went on standing by.
    assert sorted(e.store.reads for e in (a, b)) == [1, 3]  # type: ignore[attr-defined]


async def test_a_standby_takes_over_a_dead_leaders_lease_as_soon_as_it_runs_out() -> None:
    lease = MemoryLease()
    slow = Timings(lease_duration=1.0, renew_deadline=0.9, retry_period=0.5)
    a = LeaderElector(View(lease), "a", slow)  # type: ignore[arg-type]
    b = LeaderElector(View(lease), "b", slow)  # type: ignore[arg-type]
    assert await a.acquire(asyncio.Event())  # and never renews: it died
    started = time.monotonic()
    assert await asyncio.wait_for(b.acquire(asyncio.Event()), timeout=5)
    # Not before the lease ran out on b's clock, and not a retry period (0.5-0.6s) after it either.
    assert 1.0 <= time.monotonic() - started < 1.25


def released_total() -> float:
    return metrics.REGISTRY.get_sample_value("pdfleet_leader_transitions_total", {"transition": "released"}) or 0.0
