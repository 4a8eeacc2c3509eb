"""One engine group's rank health, from what its pods' agents answered. Pure: no I/O, no clock.

The runtime owns the rules (`pdfleet.runtime.health.verdict.judge`); this module only adapts the operator's
view to them and back: which ranks a pod holds, which pods did not answer, and how a runtime verdict reads in
`status.groups[]`. The judge itself is stateless (see its docstring), so one poll is enough for a verdict.

Two choices that keep the status honest *and* quiet:
- A group whose agents have never answered (the runtime is still coming up, or the image runs no agent) is
  Unknown, not Unreachable; once an agent of the group's current pods has answered, silence is Unreachable.
- Messages are stable while the verdict holds: a Healthy group reads "all N ranks make progress", never the
  ever-changing phase ages, so an unchanged verdict never causes a status write. (Desync and Hang evidence
  does carry ages; `reconcile` keeps the first evidence of an episode, see `settled_message`.)
- A group being stopped is never sick: one with a pod being deleted is Unknown ("Terminating"), whatever its
  agents answer, and one whose ranks exited cleanly is Stopped (docs/architecture.md, "Rank health").
- An answer is about a pod only if its ranks are not older than the pod (`own_answers`): a process of another
  pod that still holds the pod's address (its predecessor at that IP, stopping) must not speak for it.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from pdfleet.operator.api.health import HealthSpec
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.api.status import Verdict
from pdfleet.operator.planning.groups import parse_time, pod_ready
from pdfleet.operator.render import labels
from pdfleet.runtime.health import phases, report, verdict

Body = dict[str, Any]

# Verdicts that make a group not ready and the pool Degraded, with the condition reason each one gives.
SICK = {Verdict.DEAD: "RankDead", Verdict.DESYNC: "RankDesync", Verdict.HANG: "RankHang",
        Verdict.UNREACHABLE: "AgentUnreachable"}

# Verdicts under which a group does not serve: the sick ones, and Stopped (its ranks exited cleanly: it is being
# shut down on purpose, so not sick, never captured or restarted, but nothing answers requests there either).
NOT_SERVING = frozenset(SICK) | {Verdict.STOPPED}

_AGED = {Verdict.DESYNC, Verdict.HANG}  # verdicts whose evidence says how long it has held
_VERDICTS = {
    verdict.Health.HEALTHY: Verdict.HEALTHY,
    verdict.Health.STARTING: Verdict.UNKNOWN,
    verdict.Health.DESYNC: Verdict.DESYNC,
    verdict.Health.HANG: Verdict.HANG,
    verdict.Health.DEAD: Verdict.DEAD,
    verdict.Health.UNREACHABLE: Verdict.UNREACHABLE,
    verdict.Health.STOPPED: Verdict.STOPPED,
}


@dataclasses.dataclass(frozen=True)
class GroupHealth:
    """What the operator last judged of one group: the input `reconcile.plan` takes per group name."""

    verdict: Verdict
    event_loop: str | None  # the loop every rank runs, when they all report the same one
    message: str
    ranks: int  # ranks reporting, alive
    answered: bool = False  # some agent of the group's current pods answered this poll
    held_seconds: float = 0.0  # how long the ranks had been frozen as judged (Desync, Hang: the time to detect)
    pods: frozenset[str] = frozenset()  # uids of the pods whose agents this verdict is about (none: no agent asked)
    # Every loop the ranks report, once every rank reports (more than one: the group half switched a loop).
    loops: frozenset[str] = frozenset()
    # The catalogue patch sets the answering pods' agents report (more than one: the pods run different code), and
    # whether an answering agent did not say (a pdfleet runtime older than patch reports).
    patch_sets: frozenset[tuple[str, ...]] = frozenset()
    patches_unsaid: bool = False

    def same_as(self, other: GroupHealth | None) -> bool:
        """Equal in everything but the wording: evidence ages change every poll, the verdict does not."""
        return other is not None and (self.verdict, self.event_loop, self.ranks) == \
            (other.verdict, other.event_loop, other.ranks)


# The reports of one group's pods by pod name: a report, or None for a pod whose agent did not answer.
Answers = Mapping[str, report.PodReport | None]

# How much longer than its pod a rank may seem to have run before it is taken for another pod's: the clock skew
# tolerated between the operator and the node that stamps containers' startedAt (whole seconds, rounded down,
# which only makes a pod look older).
STARTED_SLACK = datetime.timedelta(seconds=5)


def policy(health: HealthSpec) -> verdict.HealthPolicy:
    return verdict.HealthPolicy.from_seconds(
        desync_after=parse_duration(health.desync_after).total_seconds(),
        hang_after=parse_duration(health.hang_after).total_seconds(),
    )


def live_pods(pods: Sequence[Body]) -> list[Body]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def terminating(pods: Sequence[Body]) -> list[str]:
    """The names of the group's pods being deleted (a deletionTimestamp: by a drain, a rollout, a restart or a
    person)."""
    return sorted(p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp"))


def pollable(pods: Sequence[Body], *, nodes: int) -> bool:
    """Agents are asked only once every pod of the group is up and Ready: before that the group is starting,
    and a silent agent means nothing."""
    live = live_pods(pods)
    return len(live) == nodes and all(pod_ready(p) for p in live)


def pod_started(pod: Body) -> datetime.datetime | None:
    """When the first of the pod's running containers started (`state.running.startedAt`), None when none says."""
    times = [t for c in (pod.get("status") or {}).get("containerStatuses") or []
             if (t := parse_time(((c.get("state") or {}).get("running") or {}).get("startedAt"))) is not None]
    return min(times) if times else None


def own_answers(pods: Sequence[Body], answers: Answers, *,
                now: datetime.datetime) -> dict[str, report.PodReport | None]:
    """The answers that are about their pods. Another pod's processes may answer at a pod's address (a
    predecessor at the same IP that is still stopping), and judging the pod by them would take the
    predecessor's loop and health for its own. An answer that names its pod (`PodReport.pod_uid`) is the pod's
    exactly when the uid is the pod's, and no answer at all otherwise. An answer from an agent that names no pod
    (an older runtime) loses the ranks that started before their pod did (attached to their ledger longer before
    the agent answered than the pod has run at `now`, a moment after the answers came, give or take the clock
    skew between operator and node); a report left without any rank, that had some, is no answer. Ranks whose
    report gives no attach time are kept."""
    started = {p["metadata"]["name"]: pod_started(p) for p in pods}
    uids = {p["metadata"]["name"]: p["metadata"].get("uid") for p in pods}
    out: dict[str, report.PodReport | None] = {}
    for name, answer in answers.items():
        if answer is not None and answer.pod_uid is not None:
            out[name] = answer if answer.pod_uid == uids.get(name) else None
            continue
        since = started.get(name)
        if answer is None or since is None:
            out[name] = answer
            continue
        ran_ns = (now - since + STARTED_SLACK).total_seconds() * 1e9
        kept = tuple(e for e in answer.ranks if e.record.attached_ns <= 0 or answer.now_ns - e.record.attached_ns
                     <= ran_ns)
        out[name] = answer if len(kept) == len(answer.ranks) else \
            dataclasses.replace(answer, ranks=kept) if kept else None
    return out


def pod_ranks(pod: Body, *, gpus_per_node: int) -> range:
    """The TP ranks a pod runs: node rank n holds ranks [n*g, (n+1)*g), as SGLang numbers them."""
    node_rank = int((pod["metadata"].get("labels") or {}).get(labels.RANK, "0"))
    return range(node_rank * gpus_per_node, (node_rank + 1) * gpus_per_node)


def judge_group(health: HealthSpec, *, tp: int, gpus_per_node: int, nodes: int, pods: Sequence[Body],
                answers: Answers, answered_before: bool) -> GroupHealth:
    """The verdict for one group from one poll. `answered_before`: an agent of these pods answered in an
    earlier poll (or the last status already held a verdict), so silence now is Unreachable, not Unknown."""
    live = live_pods(pods)
    if going := terminating(pods):
        # Drained, replaced or restarted: whatever its ranks show now (exits, gone processes, a silent agent)
        # is the stop itself, never a sickness to capture or restart.
        return GroupHealth(Verdict.UNKNOWN, None, f"Terminating: pod(s) {', '.join(going)} going", 0)
    if not pollable(pods, nodes=nodes):
        ready = sum(pod_ready(p) for p in live)
        return GroupHealth(Verdict.UNKNOWN, None, f"Starting: {ready}/{nodes} pod(s) ready", 0)
    reports = [a for p in live if (a := answers.get(p["metadata"]["name"])) is not None]
    if not reports and not answered_before:
        return GroupHealth(Verdict.UNKNOWN, None, f"no rank agent has answered yet ({len(live)} pod(s) asked)", 0)
    lost = [r for p in live if answers.get(p["metadata"]["name"]) is None
            for r in pod_ranks(p, gpus_per_node=gpus_per_node)]
    views = report.rank_views(reports, expected=range(tp), unreachable=lost)
    judged = verdict.judge(views, policy(health))
    mapped = _VERDICTS[judged.health]
    reporting = [v for v in views if v.status is verdict.RankStatus.REPORTING]
    return GroupHealth(mapped, _event_loop(reporting, tp), _message(mapped, judged, tp), len(reporting),
                       answered=bool(reports), held_seconds=judged.held_ns / 1e9,
                       pods=frozenset(p["metadata"].get("uid", "") for p in live), loops=_loops(reporting, tp),
                       patch_sets=frozenset(r.patches for r in reports if r.patches is not None),
                       patches_unsaid=any(r.patches is None for r in reports))


def current(health: Mapping[str, GroupHealth], pods: Mapping[str, Sequence[Body]]) -> dict[str, GroupHealth]:
    """The verdicts still about their groups' pods. A verdict on pods a group no longer has (judged before a
    restart, planned from after it: the monitor has not polled the new pods yet) is dropped, so that a Desync of
    the old pods is never taken for the new ones, captured again and restarted again."""
    out = {}
    for name, judged in health.items():
        live = {p["metadata"].get("uid", "") for p in pods.get(name, ()) if not p["metadata"].get("deletionTimestamp")}
        if not judged.pods or judged.pods == live:
            out[name] = judged
    return out


def _event_loop(reporting: list[verdict.RankView], tp: int) -> str | None:
    loops = {v.loop for v in reporting}
    if len(reporting) != tp or len(loops) != 1:
        return None
    loop = loops.pop()
    return None if loop is phases.LoopName.UNKNOWN else loop.method


def _loops(reporting: list[verdict.RankView], tp: int) -> frozenset[str]:
    if len(reporting) != tp:
        return frozenset()
    return frozenset(v.loop.method for v in reporting if v.loop is not phases.LoopName.UNKNOWN)


def _message(mapped: Verdict, judged: verdict.Verdict, tp: int) -> str:
    if mapped is Verdict.HEALTHY:
        return f"all {tp} rank(s) make progress"
    if judged.health is verdict.Health.STARTING:
        return f"Starting: {judged.reason}"
    return judged.reason


def settled_message(previous: GroupHealth | None, new: GroupHealth) -> str:
    """The first evidence of a Desync or Hang is kept while the verdict holds, so an episode held for minutes
    is written once, not once per poll with a new age. Other messages carry no ages and are taken as they are."""
    if previous is not None and new.verdict in _AGED and new.same_as(previous):
        return previous.message
    return new.message
