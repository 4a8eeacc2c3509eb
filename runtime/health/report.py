"""What an agent serves at GET /ranks, and how the operator turns it back into verdict input.

The JSON is the contract between an engine image and the operator, which are upgraded separately: names
(not numbers) for phases and loops, unknown names decode to UNKNOWN, unknown keys are ignored.

    {"version": 1, "ledger": "/dev/shm/pdfleet-ledger", "now_ns": 8123456789, "pod_uid": "6f1c…",
     "ranks": [{"slot": 0, "rank": 0, "pid": 4242, "alive": true, "consistent": true,
                "loop": "event_loop_overlap_disagg_decode", "phase": "kv_poll_all_reduce",
                "phase_since_ns": 8100000000, "phase_age_ns": 23456789, "iteration": 1041,
                "collectives": 3120, "stack_signal": 12, "pid_start": 991, "attached_ns": 4000000000}]}

`now_ns` and the `*_ns` stamps are on the pod's monotonic clock; `phase_age_ns` is the only one that
means anything off the pod. A rank that left its loop cleanly reads `"phase": "exited"`, with
`phase_since_ns` the moment it did (engines of every version write it, so no report version change).
`collective` says whether the phase is a collective: an operator older than the engine reads a phase name it
does not know as `other_collective` when it is one, so a group stuck in a collective added later still reads as
a hang, not as ranks at rest.
`pod_uid` is the uid of the pod the agent runs in (`PDFLEET_POD_UID`, from the downward API), absent when the
agent does not know it: an answer is about a pod only if it names that pod, so a process of another pod that
still holds the address (a predecessor at the same IP, stopping) never speaks for it.
`patches` lists the catalogue patches the engine was started with, every one applied in every rank process
before the agent answers (a rank that cannot apply one exits); absent from an agent that does not know them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pdfleet.runtime.health import phases, records, verdict

VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)
class RankEntry:
    """One rank as its agent saw it: the record, whether its writer still lives, its phase age."""

    record: records.RankRecord
    alive: bool
    phase_age_ns: int


@dataclasses.dataclass(frozen=True, slots=True)
class PodReport:
    """One agent's answer."""

    ledger: str
    now_ns: int
    ranks: tuple[RankEntry, ...]
    pod_uid: str | None = None  # the pod the agent runs in, when it knows
    patches: tuple[str, ...] | None = None  # the catalogue patches the engine applied, when the agent knows


def build(
    recs: Iterable[records.RankRecord],
    *,
    now_ns: int,
    ledger: str,
    alive: Callable[[records.RankRecord], bool],
    pod_uid: str | None = None,
    patches: tuple[str, ...] | None = None,
) -> PodReport:
    """The report for records read at `now_ns` (this host's monotonic clock)."""
    entries = tuple(RankEntry(r, alive(r), r.phase_age_ns(now_ns)) for r in recs)
    return PodReport(ledger=ledger, now_ns=now_ns, ranks=entries, pod_uid=pod_uid, patches=patches)


def to_json(report: PodReport) -> dict[str, Any]:
    out: dict[str, Any] = {
        "version": VERSION,
        "ledger": report.ledger,
        "now_ns": report.now_ns,
        "ranks": [_entry_json(e) for e in report.ranks],
    }
    if report.pod_uid:
        out["pod_uid"] = report.pod_uid
    if report.patches is not None:
        out["patches"] = list(report.patches)
    return out


def _entry_json(entry: RankEntry) -> dict[str, Any]:
    r = entry.record
    return {
        "slot": r.slot,
        "rank": r.rank,
        "pid": r.pid,
        "alive": entry.alive,
        "consistent": r.consistent,
        "loop": r.loop.method,
        "phase": r.phase.label,
        "collective": r.phase.is_collective,
        "phase_since_ns": r.phase_since_ns,
        "phase_age_ns": entry.phase_age_ns,
        "iteration": r.iteration,
        "collectives": r.collectives,
        "stack_signal": r.stack_signal,
        "pid_start": r.pid_start,
        "attached_ns": r.attached_ns,
    }


def from_json(data: Mapping[str, Any]) -> PodReport:
    """Parse an agent's answer. Raises ValueError when it is not one (missing or mistyped fields)."""
    try:
        entries = tuple(_entry_from_json(item) for item in data["ranks"])
        uid = data.get("pod_uid")
        patches = data.get("patches")
        if patches is not None and not (isinstance(patches, list) and all(isinstance(p, str) for p in patches)):
            raise ValueError(f"patches is not a list of ids: {patches!r}")
        return PodReport(ledger=str(data["ledger"]), now_ns=int(data["now_ns"]), ranks=entries,
                         pod_uid=str(uid) if uid else None,
                         patches=tuple(patches) if patches is not None else None)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not an agent report: {e!r}") from e


def _entry_from_json(item: Mapping[str, Any]) -> RankEntry:
    record = records.RankRecord(
        slot=int(item["slot"]),
        rank=int(item["rank"]),
        pid=int(item["pid"]),
        pid_start=int(item.get("pid_start", 0)),
        loop=phases.loop_from_label(str(item["loop"])),
        phase=_phase(item),
        phase_since_ns=int(item["phase_since_ns"]),
        iteration=int(item["iteration"]),
        collectives=int(item["collectives"]),
        stack_signal=int(item.get("stack_signal", 0)),
        attached_ns=int(item.get("attached_ns", 0)),
        consistent=bool(item.get("consistent", True)),
    )
    return RankEntry(record=record, alive=bool(item["alive"]), phase_age_ns=int(item["phase_age_ns"]))


def _phase(item: Mapping[str, Any]) -> phases.Phase:
    phase = phases.phase_from_label(str(item["phase"]))
    if phase is phases.Phase.UNKNOWN and item.get("collective") is True:
        return phases.Phase.OTHER_COLLECTIVE  # a collective added after this operator: still a place ranks wait
    return phase


def rank_views(
    reports: Iterable[PodReport], *, expected: Iterable[int], unreachable: Iterable[int] = ()
) -> list[verdict.RankView]:
    """Verdict input for a group: one view per expected rank, from the reports of the pods that
    answered and the ranks whose pods did not. A rank found in no report is ABSENT; one whose record ends
    in a clean exit is EXITED, alive or not (it may still be releasing its resources, or have been killed
    after its goodbye by the shutdown's clean-up); any other rank whose process is gone is DEAD. Should two
    reports carry the same rank (a replaced pod still answering), the live one wins."""
    lost = set(unreachable)
    found: dict[int, RankEntry] = {}
    for report in reports:
        for entry in report.ranks:
            rank = entry.record.rank
            if rank not in found or (entry.alive and not found[rank].alive):
                found[rank] = entry
    views = []
    for rank in sorted(set(expected)):
        entry = found.get(rank)
        if rank in lost:
            views.append(verdict.RankView(rank=rank, status=verdict.RankStatus.UNREACHABLE))
        elif entry is None:
            views.append(verdict.RankView(rank=rank, status=verdict.RankStatus.ABSENT))
        else:
            r = entry.record
            status = _status(entry)
            views.append(
                verdict.RankView(
                    rank=rank,
                    status=status,
                    phase=r.phase,
                    phase_age_ns=entry.phase_age_ns,
                    collectives=r.collectives,
                    iteration=r.iteration,
                    loop=r.loop,
                    pid=r.pid,
                )
            )
    return views


def _status(entry: RankEntry) -> verdict.RankStatus:
    if entry.record.exited:
        return verdict.RankStatus.EXITED
    return verdict.RankStatus.REPORTING if entry.alive else verdict.RankStatus.DEAD
