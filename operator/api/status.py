"""`status`: what the operator observed, written only by the operator (status subresource)."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.autoscaling import AutoscalingStatus
from pdfleet.operator.api.base import ApiModel
from pdfleet.operator.api.conditions import Condition, Timestamp
from pdfleet.operator.api.engine import PatchPolicy
from pdfleet.operator.api.roles import Role

Count = Annotated[int, Field(ge=0)]


class Phase(enum.StrEnum):
    """A one-word summary for `kubectl get`; conditions carry the detail."""

    PENDING = "Pending"
    PROGRESSING = "Progressing"
    READY = "Ready"
    DEGRADED = "Degraded"
    FAILED = "Failed"
    PAUSED = "Paused"


class Verdict(enum.StrEnum):
    """A group's rank-health verdict (docs/architecture.md, "Rank health")."""

    UNKNOWN = "Unknown"
    HEALTHY = "Healthy"
    DESYNC = "Desync"
    HANG = "Hang"
    DEAD = "Dead"
    UNREACHABLE = "Unreachable"
    STOPPED = "Stopped"  # its ranks exited cleanly: the engine was shut down on purpose; not sick


class RestartCause(enum.StrEnum):
    """Why the operator restarts an engine group as a unit (docs/architecture.md, "Restarts")."""

    POD_ENDED = "PodEnded"  # a pod of the group ended (phase Failed or Succeeded): see `lastExit`
    DESYNC = "Desync"
    HANG = "Hang"
    DEAD = "Dead"


class ContainerExit(ApiModel):
    """How a pod of an engine group ended, as the cluster reports it (its container's terminated state)."""

    pod: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="The pod that ended.")
    container: Annotated[str, Field(max_length=63)] | None = Field(
        default=None, description="The container that ended (the first that failed); none when the pod ended "
                                  "without one, e.g. refused or evicted.",
    )
    reason: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, description="The container's terminated reason (Error, OOMKilled, StartError, ...), or the "
                                  "pod's reason when no container ended.",
    )
    exit_code: int | None = Field(default=None, description="The container's exit code.")
    message: Annotated[str, Field(max_length=2048)] | None = Field(
        default=None, description="The terminated message: the log's last lines where the container's "
                                  "terminationMessagePolicy is FallbackToLogsOnError (its tail, when longer).",
    )
    finished_at: Timestamp | None = Field(
        default=None, description="When the container ended.", json_schema_extra={"format": "date-time"},
    )


class GateState(enum.StrEnum):
    """Where one verification gate stands for one group."""

    PASSED = "Passed"
    FAILED = "Failed"  # the engines showed something else than expected: the rollout stops
    TIMED_OUT = "TimedOut"  # rollout.verification.timeout passed before the gate could pass
    WAITING = "Waiting"  # nothing to judge yet (an agent or /server_info has not answered)
    SKIPPED = "Skipped"  # switched off in spec.rollout.verification, or not for the group's role: not judged
    # Written by pdfleet versions whose toolCallCanary gate did not run; kept so that their statuses still read.
    NOT_AVAILABLE = "NotAvailable"


class GateResult(ApiModel):
    """What one verification gate saw of one group."""

    name: Annotated[str, Field(min_length=1, max_length=63)] = Field(
        description="eventLoop, serverArgs or toolCallCanary.")
    state: GateState = Field(description="Passed, Failed, TimedOut, Waiting or Skipped (NotAvailable: written "
                                         "by earlier versions).")
    message: Annotated[str, Field(max_length=2048)] = Field(default="", description="Expected and seen.")


Amount = Annotated[float, Field(ge=0)]


class ServingSample(ApiModel):
    """One engine's serving counters at one moment, as its /metrics showed them (summed over label sets)."""

    pod: Annotated[str, Field(min_length=1, max_length=64)] = Field(description="The engine pod's uid.")
    requests: Amount = Field(default=0, description="sglang:num_requests_total.")
    aborted: Amount = Field(default=0, description="sglang:num_aborted_requests_total.")
    ttft_sum: Amount = Field(default=0, description="sglang:time_to_first_token_seconds_sum.")
    ttft_count: Amount = Field(default=0, description="sglang:time_to_first_token_seconds_count.")
    itl_sum: Amount = Field(default=0, description="sglang:inter_token_latency_seconds_sum.")
    itl_count: Amount = Field(default=0, description="sglang:inter_token_latency_seconds_count.")
    routed: Amount = Field(default=0, description="Requests the pool's routers sent the engine and saw end "
                                                  "(smg_worker_cb_outcomes_total for its URL, summed over router "
                                                  "pods and outcomes).")
    routed_failed: Amount = Field(default=0, description="Of those, the ones the routers saw fail "
                                                         "(outcome=\"failure\").")


class Bake(ApiModel):
    """A group's bake: when it began and ends, and the counters it is measured from (so that an operator
    restarted mid-bake judges the same window)."""

    since: Timestamp = Field(description="When the group's other gates passed and its bake began.",
                             json_schema_extra={"format": "date-time"})
    until: Timestamp = Field(description="When the bake ends (since + verification.bake).",
                             json_schema_extra={"format": "date-time"})
    start: tuple[ServingSample, ...] = Field(
        default=(), max_length=9, description="Counters at the bake's start: the group's leader engine first, then "
                                              "the baseline's (leaders of up to 8 groups of its role at the old "
                                              "revision).",
    )


class GroupVerification(ApiModel):
    """The verification gates' results for one group at one revision."""

    revision: Annotated[str, Field(max_length=64)] = Field(description="The revision the gates judged.")
    gates: tuple[GateResult, ...] = Field(
        default=(), max_length=8, description="One entry per gate.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    bake: Bake | None = Field(default=None, description="The group's bake, once its other gates passed.")


class RoleStatus(ApiModel):
    """Engine-group counts of one role."""

    desired: Count = Field(default=0, description="Engine groups the spec asks for.")
    ready: Count = Field(default=0, description="Groups whose every rank is Healthy and that serve.")
    updated: Count = Field(default=0, description="Groups at the update revision that passed verification "
                                                  "(surge groups not counted).")
    summary: Annotated[str, Field(max_length=32)] = Field(
        default="0/0", description="ready/desired, for kubectl get."
    )
    surge: Count | None = Field(default=None, description="Groups above desired now: a rollout's maxSurge "
                                                          "groups (counted in ready when they serve).")
    surge_unschedulable: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description="The update revision whose surge group the scheduler could not place: its "
                                  "rollout replaces this role's groups in place, up to maxUnavailable.",
    )

    @classmethod
    def of(cls, *, desired: int, ready: int, updated: int, surge: int = 0,
           surge_unschedulable: str | None = None) -> RoleStatus:
        return cls(desired=desired, ready=ready, updated=updated, summary=f"{ready}/{desired}", surge=surge or None,
                   surge_unschedulable=surge_unschedulable)


class GroupStatus(ApiModel):
    """One engine group, as last observed."""

    name: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="Group name.")
    role: Role = Field(description="prefill or decode.")
    revision: Annotated[str, Field(max_length=64)] = Field(description="Engine revision the group runs.")
    ranks: Count = Field(default=0, description="TP ranks reporting health (tp when all are up).")
    verdict: Verdict = Field(default=Verdict.UNKNOWN, description="Rank-health verdict.")
    event_loop: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, description="Scheduler event loop every rank runs, e.g. event_loop_normal_disagg_decode.",
    )
    restarts: Count = Field(default=0, description="Restarts of this group as a unit, all told.")
    last_restart_time: Timestamp | None = Field(
        default=None, description="When the operator last restarted this group as a unit.",
        json_schema_extra={"format": "date-time"},
    )
    recent_restarts: tuple[Timestamp, ...] = Field(
        default=(), max_length=100,
        description="When the group was restarted within the last restartBudget.window (oldest first); "
                    "the budget counts these.",
        json_schema_extra={"items": {"type": "string", "format": "date-time"}},
    )
    restart_cause: RestartCause | None = Field(
        default=None, description="Why the group was last restarted, is waiting to be, or was left for a person: "
                                  "PodEnded (see lastExit) or its verdict (Desync, Hang, Dead).",
    )
    next_restart_time: Timestamp | None = Field(
        default=None, description="Set while the group waits out its restart backoff: when it is restarted.",
        json_schema_extra={"format": "date-time"},
    )
    budget_exhausted: bool = Field(
        default=False, description="The group needs a restart (restartCause) and its restart budget is spent: "
                                   "the operator no longer restarts it and leaves it, with its evidence or "
                                   "lastExit, for a person. Deleting the group's pods or changing the spec "
                                   "starts the budget afresh.",
    )
    last_exit: ContainerExit | None = Field(
        default=None, description="How a pod of the group last ended; kept after the group is restarted.",
    )
    message: Annotated[str, Field(max_length=4096)] | None = Field(
        default=None, description="Why the verdict is what it is, for a person."
    )
    verified_revision: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description="The revision at which the group's current pods passed every enabled "
                                  "verification gate; unset while they have not (yet).",
    )
    verification: GroupVerification | None = Field(
        default=None, description="What the verification gates last saw of the group (spec.rollout.verification)."
    )


class RevisionWatch(ApiModel):
    """How a new revision fares from its rollout's start to the end of its postRolloutWatch."""

    revision: Annotated[str, Field(max_length=64)] = Field(description="The pool revision watched.")
    since: Timestamp | None = Field(default=None, description="When its last group was verified and its "
                                                              "postRolloutWatch began.",
                                    json_schema_extra={"format": "date-time"})
    until: Timestamp | None = Field(default=None, description="When the postRolloutWatch ends.",
                                    json_schema_extra={"format": "date-time"})
    failure: Annotated[str, Field(max_length=2048)] | None = Field(
        default=None, description="What failed the revision (a group of it turned Desync, Hang or Dead, or its pod "
                                  "ended); set once, kept for the revision.",
    )


class RouterStatus(ApiModel):
    """What one router pod can route to, as the operator last read it."""

    name: Annotated[str, Field(max_length=253)] = Field(description="The router pod.")
    available_prefill: Count = Field(default=0, description="Prefill workers it can send requests to (healthy in "
                                                            "its own checks, circuit not open).")
    available_decode: Count = Field(default=0, description="Decode workers it can send requests to.")
    open_circuits: Count = Field(default=0, description="Workers whose circuit breaker is open in it.")
    missing_workers: Count = Field(default=0, description="Workers the operator holds in rotation that it does not "
                                                          "list (yet): a rollout is not over until it does.")


PatchList = tuple[Annotated[str, Field(max_length=63)], ...]


class PatchStatus(ApiModel):
    """The patches the pool's engines run, and how that set was chosen (docs/patches.md)."""

    policy: PatchPolicy = Field(description="spec.engine.patchPolicy as resolved.")
    effective: PatchList = Field(default=(), max_length=32, description="The patches the engines run (and are "
                                                                          "rolled out to), in the order applied.")
    recommended: PatchList = Field(default=(), max_length=32, description="The fixes this operator recommends for "
                                                                            "the pool's sglangVersion.")
    held: PatchList = Field(default=(), max_length=32, description="Recommended fixes the engines do not run yet: "
                            "they became recommended (an operator upgrade) after the pool's engine-shaping spec last "
                            "changed, and are rolled out with its next change.")
    opted_out: PatchList = Field(default=(), max_length=32, description="Recommended fixes the engines run without "
                                 "because patchPolicy is Explicit and patches does not list them.")
    for_spec: Annotated[str, Field(max_length=64)] = Field(
        default="", description="A hash of the engine-shaping spec this set was chosen for: while it holds, the "
                                "set holds.")


class InferencePoolStatus(ApiModel):
    """The observed state of the pool."""

    phase: Phase = Field(default=Phase.PENDING, description="One-word summary.")
    observed_generation: Count | None = Field(
        default=None, description="metadata.generation this status was computed from."
    )
    current_revision: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description="Revision every engine group last ran with all its pods Ready and verified "
                                  "(every group passed spec.rollout.verification's gates)."
    )
    update_revision: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description="Revision the spec asks for; differs from currentRevision during a rollout."
    )
    prefill: RoleStatus = Field(default_factory=RoleStatus, description="Prefill group counts.")
    decode: RoleStatus = Field(default_factory=RoleStatus, description="Decode group counts.")
    groups: tuple[GroupStatus, ...] = Field(
        default=(), max_length=4096, description="One entry per engine group.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    routers: tuple[RouterStatus, ...] = Field(
        default=(), max_length=64, description="What each router pod can route to, as the operator last read "
                                               "it: a router with no available worker of a role answers its "
                                               "requests 503 and is not serving.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    watch: RevisionWatch | None = Field(
        default=None, description="How the last new revision rolled out fared, during its rollout and its "
                                  "postRolloutWatch.",
    )
    patches: PatchStatus | None = Field(
        default=None, description="The patches the engines run, and the recommended ones they run without.")
    autoscaling: AutoscalingStatus | None = Field(
        default=None, description="What spec.autoscaling last decided per role, and why (written by the autoscaler "
                                  "when its decision or recommendation changes, not at every poll).")
    conditions: tuple[Condition, ...] = Field(
        default=(), max_length=32, description="Accepted, Ready, Progressing, Degraded, RolloutVerified.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )

    def role(self, role: Role) -> RoleStatus:
        return self.prefill if role is Role.PREFILL else self.decode
