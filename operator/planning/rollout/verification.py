"""Verification gates: what a group of a new revision must show before it counts as updated. Pure.

A group is judged once every pod of it runs the revision it should and is Ready (`GroupState.READY`). Each
enabled gate (`spec.rollout.verification`) then reads what the engines say of themselves:

- eventLoop: every rank reports the scheduler loop the spec implies (`expected_event_loop`), from the rank
  agents (`rank_health.GroupHealth.event_loop`);
- patches: every pod's rank agent reports the catalogue patches its engine applied, and they are the spec's
  resolved set (`patch_set`; skipped for an engine runtime that does not report them);
- serverArgs: the group's leader engine's `/server_info` shows the operator-owned flags the renderer decided for
  that pod (`DesiredGroup.flags`, typed by `expected_server_args`), not every default;
- toolCallCanary (off unless switched on): the canary's tool-calling requests, sent to the decode group's leader
  paired with a Ready prefill engine, came back as structured tool calls with no DSML markup in content
  (`canary_gate`); prefill groups list it as Skipped (it does not apply to them).

Everything the gates read is tied to the pods it is about (`EngineFacts.pods`, by uid), so what was seen of a
group's old pods is never taken for its new ones. The results live in `status.groups[].verification` and
`verifiedRevision`: a failed gate stays failed for its revision (the rollout holds until the spec changes) and a
passed one stays passed while the group's pods run the revision they were verified at. Nothing is kept only in
memory, so an operator restarted at any moment judges the same.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from pdfleet.operator.api import flags
from pdfleet.operator.api.conditions import ConditionStatus
from pdfleet.operator.api.engine import Switch
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.rollout import VerificationSpec
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import Bake, GateResult, GateState, GroupStatus, GroupVerification, ServingSample
from pdfleet.operator.planning.groups import leader_pod, parse_time
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.rollout import bake, canary_gate
from pdfleet.operator.planning.rollout.canary_gate import CanaryFinding
from pdfleet.operator.render import labels
from pdfleet.operator.render.desired import DesiredGroup
from pdfleet.operator.render.engine_args import Flag
from pdfleet.runtime.health import phases

Body = dict[str, Any]

EVENT_LOOP = "eventLoop"
PATCHES = "patches"
SERVER_ARGS = "serverArgs"
STOPPED = frozenset({GateState.FAILED, GateState.TIMED_OUT})  # gate states that stop the rollout
ANALYSIS_FAILED = "AnalysisFailed"  # RolloutVerified's reason when a group failed its bake

# Each operator-owned flag the gate compares, as SGLang's ServerArgs field /server_info reports and its type there
# (from the one table, `api.flags.FLAGS`; checked against the installed SGLang in tests/unit/test_verification.py).
SERVER_ARG_FIELDS: dict[str, tuple[str, type]] = flags.server_args_fields()
# Managed flags not compared, and why.
NOT_COMPARED: dict[str, str] = {name: f.unchecked for name, f in flags.FLAGS.items() if f.unchecked is not None}
# Flags the operator owns through a Switch: their absence is rendered on purpose (the switch is Enabled), so
# the engine must show them off, too.
SWITCHED = tuple(name for name, f in flags.FLAGS.items() if f.switch)
SERVER_INFO_FIELDS = frozenset(field for field, _ in SERVER_ARG_FIELDS.values())


@dataclasses.dataclass(frozen=True)
class EngineFacts:
    """What the health monitor saw of one group's engines in the poll that judged its health: the input
    `reconcile.plan` takes per group name, next to `health`."""

    pods: frozenset[str]  # uids of the pods the poll (and so the group's GroupHealth) was about
    server_info: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)  # by pod uid
    canary: Mapping[str, CanaryFinding] = dataclasses.field(default_factory=dict)  # by decode leader pod uid
    metrics: Mapping[str, ServingSample] = dataclasses.field(default_factory=dict)  # leader's /metrics, by pod uid


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A group's verification after this reconcile."""

    revision: str  # the revision the group should run
    verified_revision: str | None
    verification: GroupVerification | None
    deadline: datetime.datetime | None = None  # when a waiting gate times out
    baking_started: bool = False  # the group's bake began in this reconcile
    bake_result: GateState | None = None  # the bake ended in this reconcile: Passed, Failed or TimedOut

    @property
    def verified(self) -> bool:
        return self.verified_revision == self.revision

    @property
    def stopped(self) -> GateResult | None:
        """The gate that failed or timed out at the revision the group should run, if one did: the rollout
        holds."""
        if self.verification is None or self.verification.revision != self.revision:
            return None
        return next((g for g in self.verification.gates if g.state in STOPPED), None)


def failed(check: GroupVerification | None) -> bool:
    """A gate of this verification (its bake included) failed or timed out."""
    return check is not None and any(g.state in STOPPED for g in check.gates)


def expected_event_loop(spec: InferencePoolSpec, role: Role) -> str:
    """The loop SGLang's `_dispatch_event_loop_once` picks for a PD engine of `role` rendered from `spec`:
    `event_loop_overlap_disagg_<role>` unless --disable-overlap-schedule (overlapSchedule: Disabled), then
    `event_loop_normal_disagg_<role>` (pipeline parallelism, the third choice, is refused by the API)."""
    kind = "normal" if spec.engine.overlap_schedule is Switch.DISABLED else "overlap"
    loop = phases.LoopName.from_method(f"event_loop_{kind}_disagg_{role}")
    assert loop is not phases.LoopName.UNKNOWN, f"no SGLang loop for {kind} {role}"
    return loop.method


def expected_server_args(flags: Sequence[Flag]) -> dict[str, Any]:
    """ServerArgs field -> value for every compared flag of those the renderer decided for a pod, typed as
    /server_info reports it. Switch flags the operator left out are expected off."""
    out: dict[str, Any] = {}
    for name, value in flags:
        if name not in SERVER_ARG_FIELDS:
            continue
        field, kind = SERVER_ARG_FIELDS[name]
        out[field] = True if value is None else kind(value)
    for flag in SWITCHED:
        out.setdefault(SERVER_ARG_FIELDS[flag][0], False)
    return out


def _seen(value: Any, kind: type) -> Any:
    try:
        return value if value is None else kind(value)
    except (TypeError, ValueError):
        return value


def server_args_mismatches(expected: Mapping[str, Any], seen: Mapping[str, Any]) -> list[str]:
    """'field: expected X, seen Y' for each expected field the engine shows otherwise."""
    kinds = dict(SERVER_ARG_FIELDS.values())
    out = []
    for field, want in expected.items():
        got = _seen(seen.get(field), kinds.get(field, str))
        if field not in seen:
            out.append(f"{field}: expected {want!r}, not reported")
        elif got != want:
            out.append(f"{field}: expected {want!r}, seen {got!r}")
    return out


def ready_since(pods: Sequence[Body]) -> datetime.datetime | None:
    """When the last of the pods became Ready (their Ready condition's transition, which kubelet always sets),
    None when a pod does not say: then nothing times out."""
    times = []
    for pod in pods:
        cond = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
        moment = parse_time(cond.get("lastTransitionTime"))
        if moment is None:
            return None
        times.append(moment)
    return max(times) if times else None


def _live(pods: Sequence[Body]) -> list[Body]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _running(pods: Sequence[Body]) -> str | None:
    """The one revision every live pod of the group runs, or None."""
    revisions = {(p["metadata"].get("labels") or {}).get(labels.REVISION) for p in _live(pods)}
    return revisions.pop() if len(revisions) == 1 else None


def _event_loop_gate(expected: str, health: GroupHealth | None, current: bool) -> GateResult:
    if health is None or not current:
        return GateResult(name=EVENT_LOOP, state=GateState.WAITING,
                          message=f"expected {expected}: no rank agent of the group's current pods judged yet")
    if health.event_loop is None and len(health.loops) > 1:
        # Every rank reports, and not the same loop: the group half switched, which waiting will not mend.
        return GateResult(name=EVENT_LOOP, state=GateState.FAILED,
                          message=f"expected {expected}, seen the ranks disagree: {', '.join(sorted(health.loops))}")
    if health.event_loop is None:
        return GateResult(name=EVENT_LOOP, state=GateState.WAITING,
                          message=f"expected {expected}: the ranks do not all report one loop yet "
                                  f"({health.ranks} reporting)")
    if health.event_loop == expected:
        return GateResult(name=EVENT_LOOP, state=GateState.PASSED, message=f"every rank runs {expected}")
    return GateResult(name=EVENT_LOOP, state=GateState.FAILED,
                      message=f"expected {expected}, seen {health.event_loop}")


def _patches_gate(expected: Sequence[str], health: GroupHealth | None, current: bool) -> GateResult:
    want = ", ".join(expected) or "none"
    if health is None or not current or not health.answered:
        return GateResult(name=PATCHES, state=GateState.WAITING,
                          message=f"expected {want}: no rank agent of the group's current pods judged yet")
    if len(health.patch_sets) > 1:
        seen = "; ".join(", ".join(s) or "none" for s in sorted(health.patch_sets))
        return GateResult(name=PATCHES, state=GateState.FAILED,
                          message=f"expected {want}, seen the pods disagree: {seen}")
    if not health.patch_sets:
        return GateResult(name=PATCHES, state=GateState.SKIPPED,
                          message="the engines' pdfleet runtime does not report its patches (older than this "
                                  "operator): not verified")
    [seen] = health.patch_sets
    if set(seen) != set(expected):
        return GateResult(name=PATCHES, state=GateState.FAILED, message=f"expected {want}, seen "
                                                                         f"{', '.join(seen) or 'none'}")
    return GateResult(name=PATCHES, state=GateState.PASSED, message=f"every pod's engine applied {want}")


def _server_args_gate(want_flags: Sequence[Flag], leader: Body | None, facts: EngineFacts | None) -> GateResult:
    name = leader["metadata"]["name"] if leader is not None else "the leader pod"
    seen = facts.server_info.get(leader["metadata"].get("uid", "")) if facts and leader is not None else None
    if seen is None:
        return GateResult(name=SERVER_ARGS, state=GateState.WAITING,
                          message=f"waiting for /server_info of {name}")
    expected = expected_server_args(want_flags)
    wrong = server_args_mismatches(expected, seen)
    if wrong:
        return GateResult(name=SERVER_ARGS, state=GateState.FAILED, message=f"{name}: {'; '.join(wrong)}")
    return GateResult(name=SERVER_ARGS, state=GateState.PASSED,
                      message=f"{name} shows the {len(expected)} operator-owned arg(s) it was rendered with")


def _canary_gate(policy: VerificationSpec, role: Role, leader: Body | None, facts: EngineFacts | None) -> GateResult:
    found = facts.canary.get(leader["metadata"].get("uid", "")) if facts and leader is not None else None
    return canary_gate.gate(role, policy.tool_call_canary, leader, found)


def verify(policy: VerificationSpec, *, role: Role, expected_loop: str, revision: str, ready: bool,
           want_flags: Sequence[Flag], pods: Sequence[Body], before: GroupStatus | None,
           health: GroupHealth | None, facts: EngineFacts | None, now: datetime.datetime,
           baking: bake.Policy | None = None, samples: Mapping[str, ServingSample] | None = None,
           baseline: Sequence[str] = (), state: object = None, patches: Sequence[str] = ()) -> Outcome:
    """One group's verification. `revision`: the one it should run; `ready`: every pod of it runs that
    revision and is Ready; `want_flags`: its leader's operator-owned flags as rendered; `patches`: the
    catalogue patches its engines should have applied; `before`: its last status; `role`: the group's.
    `baking`: whether groups of this revision bake (None: no bake gate at all); `samples`: the latest /metrics
    counters of the pool's engines by pod uid; `baseline`: the leader pod uids of its role's groups at the old
    revision; `state`: the group's state, for messages."""
    last = before.verification if before else None
    running = _running(pods)
    if last is not None and last.revision == revision and any(g.state in STOPPED for g in last.gates):
        return Outcome(revision, None, last)  # a failure holds for its revision: the spec must change
    kept = last if last is not None and last.revision == running else None
    if before is not None and before.verified_revision is not None and before.verified_revision == running:
        return Outcome(revision, running, kept)  # verified, and still the pods it was verified on
    live = _live(pods)
    if last is not None and last.revision == revision and last.bake is not None:
        return _baking(policy, role, revision, last, last.bake, now=now, leader=leader_pod(live),
                       samples=samples or {}, sick=bake.sick_reason(
                           ready=ready, state=state, verdict=health.verdict if health else None,
                           message=health.message if health else None))
    if not ready:
        return Outcome(revision, None, kept)
    current = facts is not None and facts.pods == frozenset(p["metadata"].get("uid") for p in live)
    gates = [
        _event_loop_gate(expected_loop, health, current) if policy.event_loop
        else GateResult(name=EVENT_LOOP, state=GateState.SKIPPED, message="switched off"),
        _patches_gate(patches, health, current) if policy.patches
        else GateResult(name=PATCHES, state=GateState.SKIPPED, message="switched off"),
        _server_args_gate(want_flags, leader_pod(live), facts if current else None) if policy.server_args
        else GateResult(name=SERVER_ARGS, state=GateState.SKIPPED, message="switched off"),
        _canary_gate(policy, role, leader_pod(live), facts if current else None),
    ]
    started: Bake | None = None
    if baking is not None:
        head = leader_pod(live)
        own = (samples or {}).get(str(head["metadata"].get("uid"))) if head is not None else None
        if baking.skipped is not None:
            gates.append(GateResult(name=bake.BAKE, state=GateState.SKIPPED, message=baking.skipped))
        elif not all(g.state in (GateState.PASSED, GateState.SKIPPED) for g in gates):
            gates.append(GateResult(name=bake.BAKE, state=GateState.WAITING, message="after the other gates"))
        elif own is None:
            gates.append(GateResult(name=bake.BAKE, state=GateState.WAITING,
                                    message="waiting for /metrics of the leader engine to start the bake from"))
        else:
            started = bake.begin(now=now, duration=baking.duration, leader=own,
                                 baseline=[s for uid in baseline if (s := (samples or {}).get(uid)) is not None])
            gates.append(GateResult(name=bake.BAKE, state=GateState.WAITING,
                                    message=f"baking until {started.until.strftime('%H:%M:%SZ')}: began"))
    if started is not None:
        return Outcome(revision, None, GroupVerification(revision=revision, gates=tuple(gates), bake=started),
                       started.until, baking_started=True)
    deadline = None
    if any(g.state is GateState.WAITING for g in gates):
        since = ready_since(live)
        timeout = parse_duration(policy.timeout)
        deadline = since + timeout if since is not None else None
        if deadline is not None and deadline <= now:
            gates = [GateResult(name=g.name, state=GateState.TIMED_OUT,
                                message=f"not passed within {policy.timeout} of the group's pods being Ready: "
                                        f"{g.message}")
                     if g.state is GateState.WAITING else g for g in gates]
            deadline = None
    verification = GroupVerification(revision=revision, gates=tuple(gates))
    passed = all(g.state in (GateState.PASSED, GateState.SKIPPED) for g in gates)
    return Outcome(revision, revision if passed else None, verification, deadline)


def _baking(policy: VerificationSpec, role: Role, revision: str, last: GroupVerification, record: Bake, *,
            now: datetime.datetime, leader: Body | None, samples: Mapping[str, ServingSample],
            sick: str | None) -> Outcome:
    """A group whose other gates passed and whose bake began: only the bake is judged now."""
    judged = bake.judge(policy, role, record, now=now, leader=str(leader["metadata"].get("uid")) if leader else None,
                        samples=samples, sick=sick)
    gates = (*(g for g in last.gates if g.name != bake.BAKE), judged.gate)
    verification = GroupVerification(revision=revision, gates=gates, bake=record)
    state = judged.gate.state
    return Outcome(revision, revision if state is GateState.PASSED else None, verification, judged.deadline,
                   bake_result=state if state is GateState.PASSED or state in STOPPED else None)


@dataclasses.dataclass(frozen=True)
class RolloutVerified:
    """The pool's RolloutVerified condition, from its groups' outcomes."""

    status: ConditionStatus
    reason: str
    message: str


def rollout_verified(groups: Sequence[DesiredGroup], outcomes: Mapping[str, Outcome],
                     update_revision: str) -> RolloutVerified:
    """True when every group runs its revision verified; False (GateFailed, GateTimedOut) when a gate of one
    stopped the rollout, naming the gate, the group and what it expected and saw; Unknown (Verifying) else."""
    for group in groups:
        gate = outcomes[group.name].stopped
        if gate is not None:
            reason = "GateTimedOut" if gate.state is GateState.TIMED_OUT else \
                ANALYSIS_FAILED if gate.name == bake.BAKE else "GateFailed"
            return RolloutVerified(ConditionStatus.FALSE, reason,
                                   f"gate {gate.name} failed for {group.id.role} group {group.name} at revision "
                                   f"{group.revision}: {gate.message}")
    pending = [g for g in groups if not outcomes[g.name].verified]
    if not pending:
        return RolloutVerified(ConditionStatus.TRUE, "AllGroupsVerified",
                               f"every group of revision {update_revision} passed verification")
    judged = [g for g in pending if (v := outcomes[g.name].verification) is not None and v.revision == g.revision]
    first = (judged or pending)[0]
    waiting = outcomes[first.name].verification
    gates = [f"{g.name}: {g.message}" for g in waiting.gates if g.state is GateState.WAITING] if judged and \
        waiting is not None else []
    what = "; ".join(gates) if gates else "its pods do not all run that revision and are Ready yet"
    return RolloutVerified(ConditionStatus.UNKNOWN, "Verifying",
                           f"{len(groups) - len(pending)}/{len(groups)} group(s) verified at revision "
                           f"{update_revision}; waiting for {first.name}: {what}")
