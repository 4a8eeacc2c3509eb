"""Which of a pool's writes would land on an object that is not the pool's, and what the pool says of it.

The operator names a pool's objects after the pool (`<pool>-router`, `<pool>-router-key`, `<pool>-engines`,
`<pool>-prefill-0-0`...), and server-side apply with force takes over whatever already has the name, ownerReference
and all; the garbage collector then deletes it with the pool. So whoever may create a pool could take over, and
later have deleted, a Role, a Secret or a Deployment of the namespace by choosing a pool name. Instead an object
with a name the pool would write that is not controlled by the pool (no ownerReference with `controller: true`
and the pool's uid) blocks the pool: the executor writes nothing of it (not that object, nor anything else: a
running pool keeps its objects as they are), sets `Accepted=False` (reason `ObjectNotOwned`, the objects named,
what to do said), posts one Warning, and looks again every `RECHECK_S` seconds until the objects are gone.

What the cache holds is the pool's by the pool's name; what it does not hold (unlabelled objects, and Secrets,
which the operator does not watch) the executor reads by name (`kube.existing`) before its first write, unless
this process has just written the object itself. Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from pdfleet.operator.planning import refusals
from pdfleet.operator.planning.plan import Event

Body = dict[str, Any]
ObjectKey = tuple[str, str]  # (kind, name)

REASON = "ObjectNotOwned"
# Seconds between looks at a blocked pool's objects. An unlabelled object, or a Secret, makes no watch event the
# operator sees when it goes, so the pool is looked at again on a timer; the resync (5 minutes) is too slow for a
# person who has just deleted the object and waits for the pool.
RECHECK_S = 10.0
MAX_NAMED = 10  # blocking objects named in the message; the rest are counted


@dataclasses.dataclass(frozen=True, order=True)
class Blocker:
    """An object with a name the pool would write that the pool does not control, and who does (if anyone)."""

    kind: str
    namespace: str
    name: str
    controller: str = ""  # "ReplicaSet web-1", "InferencePool tiny (uid ...)"; empty: no controller

    def __str__(self) -> str:
        held = f"controlled by {self.controller}" if self.controller else "no controller"
        return f"{self.kind} {self.namespace}/{self.name} ({held})"


class Blocked(Exception):
    """Raised by I/O that found an object of the pool's not controlled by it (the router-key Secret's read)."""

    def __init__(self, blockers: tuple[Blocker, ...]) -> None:
        super().__init__("; ".join(map(str, blockers)))
        self.blockers = blockers


def key_of(obj: Mapping[str, Any]) -> ObjectKey:
    return obj["kind"], obj["metadata"]["name"]


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `obj` has an ownerReference with controller: true and the pool's uid (the name is not enough: a
    pool deleted and made again under the same name is another pool)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(ref.get("controller") and ref.get("uid") == uid for ref in refs)


def _controller(obj: Mapping[str, Any]) -> str:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return f"{ref.get('kind', '?')} {ref.get('name', '?')} (uid {ref.get('uid', '?')})"
    return ""


def unverified(desired: Iterable[Mapping[str, Any]], owned: Mapping[ObjectKey, Any],
               written: Iterable[ObjectKey]) -> list[Mapping[str, Any]]:
    """The desired objects nothing this process knows vouches for: not in the cache as an object of a pool of this
    name (which `blockers` checks by uid) and not written by this process so recently that the watch may not show
    it yet (what it wrote carries the pool's reference). These are read by name before anything is written."""
    known = set(owned) | set(written)
    return [obj for obj in desired if key_of(obj) not in known]


def blockers(uid: str, namespace: str, desired: Iterable[Mapping[str, Any]],
             seen: Mapping[ObjectKey, Mapping[str, Any] | None]) -> tuple[Blocker, ...]:
    """The objects among `seen` (the cache's, and what was read by name; None: read, and absent) that have a
    desired object's name and are not controlled by the pool `uid`, sorted. A desired object not in `seen` at
    all was vouched for without a read (`unverified`)."""
    out = set()
    for obj in desired:
        found = seen.get(key_of(obj))
        if found is not None and not controlled_by(found, uid):
            out.add(Blocker(obj["kind"], namespace, obj["metadata"]["name"], _controller(found)))
    return tuple(sorted(out))


def message(blocked: tuple[Blocker, ...]) -> str:
    named = ", ".join(map(str, blocked[:MAX_NAMED]))
    more = f" and {len(blocked) - MAX_NAMED} more" if len(blocked) > MAX_NAMED else ""
    return (f"{len(blocked)} object(s) with a name this pool would write already exist and are not controlled by "
            f"it: {named}{more}. The operator leaves them alone and creates, changes or deletes nothing of the pool "
            "while one is there; delete or rename each, or create the pool under another name. The pool goes on "
            "by itself once they are gone.")


def blocked_status(pool: Mapping[str, Any], planned: Body | None, blocked: tuple[Blocker, ...],
                   now: datetime.datetime) -> tuple[Body | None, tuple[Event, ...]]:
    """The status to write (None when the pool already says exactly this), from the one the planner computed
    (`planned`, None when it saw no change): `Accepted=False` with `REASON`, phase Degraded; and the Warning to
    post, only when the condition did not already name the same objects (a blocked pool is looked at every
    `RECHECK_S` seconds and says it once)."""
    text = message(blocked)
    status, before = refusals.not_accepted(pool, planned, REASON, text, now)
    said = before is not None and (before.status, before.reason, before.message) == ("False", REASON, text)
    return status, (() if said else (Event("Warning", REASON, text),))
