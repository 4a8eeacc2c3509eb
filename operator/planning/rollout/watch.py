"""A new revision is watched from its rollout's start to the end of `rollout.postRolloutWatch`. Pure.

A group of a new revision that turns Desync, Hang or Dead, or whose pod ends, is the revision's failure, not one
group's bad luck: restarting it, and then its neighbours as they fail the same way, burns one restart budget
after another while the pool loses capacity. So while a revision never verified before rolls out, and for
`postRolloutWatch` after its last group was verified, such a group fails the rollout (RolloutVerified False,
RevisionFailed), and with autoRollback the pool goes back at once. The record that rollback and undo return to
moves only once the watch passed (RolloutVerified True); until then the condition is Unknown, Watching.

The watch lives in `status.watch` (its start, end and failure), so an operator restarted in the middle judges
the same window, and a failure, once seen, holds for its revision.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable

from pdfleet.operator.api.conditions import ConditionStatus
from pdfleet.operator.api.status import GroupStatus, RevisionWatch
from pdfleet.operator.planning.rollout.bake import FAILING
from pdfleet.operator.planning.rollout.verification import RolloutVerified

FAILED_REASON = "RevisionFailed"
WATCHING_REASON = "Watching"


def failing(groups: Iterable[tuple[GroupStatus, str, bool]]) -> str | None:
    """The first group of the new revision that fails it, said for a person; None when none does. Each entry:
    the group's status, the revision it should run, and whether a pod of it ended."""
    for group, should_run, ended in groups:
        if group.revision != should_run:
            continue  # still the old revision's pods: the new one is not to blame
        if group.verdict in FAILING:
            return f"{group.role} group {group.name} turned {group.verdict}" + \
                (f" ({group.message})" if group.message else "")
        if ended:
            why = group.last_exit
            said = f" (pod {why.pod}: {why.reason or 'ended'}, exit code {why.exit_code})" if why is not None else ""
            return f"a pod of {group.role} group {group.name} ended{said}"
    return None


@dataclasses.dataclass(frozen=True)
class Watched:
    watch: RevisionWatch | None
    rollout: RolloutVerified  # the RolloutVerified condition, after the watch
    passed: bool = False  # the watch ended, passed, in this reconcile


def judge(*, duration: datetime.timedelta, previous: RevisionWatch | None, active: bool, completing: bool,
          verified: RolloutVerified, failure: str | None, update: str, now: datetime.datetime,
          auto_rollback: bool) -> Watched:
    """The revision's watch after this reconcile.

    `active`: the update revision is new (the pool ran another before, and it was never verified); `completing`:
    the status moves currentRevision to it in this reconcile; `verified`: RolloutVerified from the groups' gates;
    `failure`: what `failing` found now."""
    watch = previous if previous is not None and previous.revision == update else None
    if watch is not None and watch.failure is not None:
        return Watched(watch, _failed(watch))
    if not active or verified.status is ConditionStatus.FALSE:
        if watch is not None and watch.until is not None and now >= watch.until and \
                verified.status is ConditionStatus.TRUE:
            verified = dataclasses.replace(verified, message=f"{verified.message}, and it passed its postRolloutWatch")
        return Watched(watch if watch is not None else previous, verified)
    in_rollout = verified.status is not ConditionStatus.TRUE
    started = watch is not None and watch.since is not None and watch.until is not None
    watching = started and watch is not None and watch.until is not None and now < watch.until
    if failure is not None and (in_rollout or watching or (completing and duration > datetime.timedelta())):
        failed = RevisionWatch(revision=update, since=watch.since if watch else None,
                               until=watch.until if watch else None, failure=failure[:2048])
        return Watched(failed, _failed(failed))
    if in_rollout:
        return Watched(watch if watch is not None else RevisionWatch(revision=update), verified)
    if not started:
        if not completing or duration <= datetime.timedelta():
            return Watched(watch, verified)
        watch = RevisionWatch(revision=update, since=now, until=now + duration)
    assert watch is not None and watch.until is not None
    if now >= watch.until:
        return Watched(watch, dataclasses.replace(
            verified, message=f"{verified.message}, and it passed its postRolloutWatch"), passed=True)
    then = "the pool rolls back" if auto_rollback else "the rollout fails"
    return Watched(watch, RolloutVerified(
        ConditionStatus.UNKNOWN, WATCHING_REASON,
        f"every group of revision {update} is verified; postRolloutWatch until {watch.until:%H:%M:%SZ}: if a group "
        f"of it turns Desync, Hang or Dead, or a pod of it ends, {then}"))


def _failed(watch: RevisionWatch) -> RolloutVerified:
    when = "during its postRolloutWatch" if watch.since is not None else "during its rollout"
    return RolloutVerified(ConditionStatus.FALSE, FAILED_REASON,
                           f"revision {watch.revision} failed {when}: {watch.failure}")
