"""The election loop: stand by until the Lease is ours, renew it while we lead, release it on shutdown.

Decisions come from `decision` (pure); this module adds the clock, the Lease I/O, logs and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime

from pdfleet.operator import metrics
from pdfleet.operator.kube.kube_client import KubeError
from pdfleet.operator.leader import decision
from pdfleet.operator.leader.decision import Action, LeaseRecord, Observation, Timings
from pdfleet.operator.leader.lease import LeaseStore

log = logging.getLogger(__name__)

# A standby retries this long after the holder's lease runs out on its clock: past it, never just before.
EXPIRY_MARGIN = 0.05


def _utcnow() -> datetime:
    return datetime.now(UTC)


class LeaderElector:
    def __init__(self, store: LeaseStore, identity: str, timings: Timings, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], datetime] = _utcnow) -> None:
        timings.validate()
        self.store = store
        self.identity = identity
        self.timings = timings
        self.is_leader = False
        self._clock = clock
        self._wall = wall
        self._observation: Observation | None = None
        self._written: LeaseRecord | None = None  # our last successful write, the base of a release
        self._last_renewed = 0.0  # when that write was sent (monotonic)
        self._last_error = ""
        self._seen_holder: str | None = None
        metrics.LEADER.set(0)

    @property
    def lease(self) -> str:
        return f"{self.store.namespace}/{self.store.name}"

    @property
    def holder(self) -> str:
        """The holder as last observed ("" when free or unknown)."""
        record = self._observation.record if self._observation else None
        return record.holder if record else ""

    async def _try_acquire_or_renew(self, timeout: float) -> bool:
        """One attempt: True when this replica holds the Lease after it."""
        sent = self._clock()
        record = await self.store.get(timeout=timeout)
        self._observation = decision.observe(self._observation, record, self._clock())
        choice = decision.decide(self._observation, identity=self.identity, now=self._clock(), wall=self._wall(),
                                 timings=self.timings)
        if choice.action is Action.STANDBY or choice.record is None:
            return False
        remaining = max(0.1, timeout - (self._clock() - sent))
        write = self.store.create if choice.action is Action.CREATE else self.store.update
        written = await write(choice.record, timeout=remaining)
        if written is None:
            return False  # another replica wrote first
        self._observation = decision.observe(self._observation, written, self._clock())
        self._written, self._last_renewed = written, sent
        return True

    def _note_failure(self, error: Exception) -> None:
        """Logs an API error once, not on every retry."""
        text = str(error)
        if text != self._last_error:
            log.warning("leader election: cannot reach the Lease %s: %s", self.lease, text)
            self._last_error = text

    def _note_holder(self) -> None:
        if self.holder != self._seen_holder:
            self._seen_holder = self.holder
            if self.holder and self.holder != self.identity:
                log.info("standing by: the Lease %s is held by %s", self.lease, self.holder)

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Stands by until this replica holds the Lease (True), or until `stop` is set (False)."""
        log.info("leader election: %s campaigns for the Lease %s", self.identity, self.lease)
        while not stop.is_set():
            try:
                acquired = await self._try_acquire_or_renew(timeout=self.timings.renew_deadline)
            except (KubeError, TimeoutError) as e:
                self._note_failure(e)
                acquired = False
            if acquired:
                self.is_leader = True
                metrics.LEADER.set(1)
                metrics.LEADER_TRANSITIONS.labels(transition="acquired").inc()
                log.info("became the leader: %s holds the Lease %s", self.identity, self.lease)
                return True
            self._note_holder()
            pause = self.timings.retry_period * (1 + decision.STANDBY_JITTER * random.random())
            expiry = decision.until_expiry(self._observation, self.identity, self._clock()) \
                if self._observation else None
            if expiry is not None:
                pause = min(pause, expiry + EXPIRY_MARGIN)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
        return False

    async def hold(self) -> str:
        """Renews the Lease every retry period while leading; returns why leadership was lost: no successful
        renewal within the renew deadline, or another replica holds the Lease."""
        while True:
            await asyncio.sleep(self.timings.retry_period)
            if decision.renew_deadline_passed(self._last_renewed, self._clock(), self.timings):
                return self._lost(f"no renewal succeeded within the renew deadline ({self.timings.renew_deadline:g}s)"
                                  + (f"; last error: {self._last_error}" if self._last_error else ""))
            remaining = self._last_renewed + self.timings.renew_deadline - self._clock()
            try:
                renewed = await asyncio.wait_for(self._try_acquire_or_renew(timeout=remaining), remaining)
            except (KubeError, TimeoutError) as e:
                self._note_failure(e)
                renewed = False
            if renewed:
                self._last_error = ""
            elif self.holder not in ("", self.identity):
                return self._lost(f"the Lease is held by {self.holder}")

    def _lost(self, reason: str) -> str:
        self.is_leader = False
        metrics.LEADER.set(0)
        metrics.LEADER_TRANSITIONS.labels(transition="lost").inc()
        return reason

    async def release(self) -> None:
        """On graceful shutdown: hands the Lease back, so a standby takes over on its next retry instead of
        waiting out the lease duration. Best effort: on failure the Lease simply expires."""
        if not self.is_leader or self._written is None:
            return
        self.is_leader = False
        metrics.LEADER.set(0)
        try:
            written = await self.store.update(decision.released(self._written, self._wall()),
                                              timeout=self.timings.renew_deadline)
        except KubeError as e:
            log.warning("could not release the Lease %s (it expires in %ss): %s", self.lease,
                        self._written.lease_duration_seconds, e)
            return
        if written is not None:
            metrics.LEADER_TRANSITIONS.labels(transition="released").inc()
            log.info("released the Lease %s: a standby takes over now", self.lease)
