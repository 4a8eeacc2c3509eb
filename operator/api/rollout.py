"""`spec.rollout`: how a new engine revision replaces the old one.

A change to anything that shapes the engine process is a new revision. Groups of the old revision are replaced
whole, a role at a time in `order`. The first group of each role on the new revision is its canary: no second
group of the role is started or replaced until it counts as replaced. Then, without `maxSurge`, up to
`maxUnavailable` groups of the role are out of service at once; with it, new groups start above `replicas` and an
old group goes only while `replicas` groups of the role serve.
A group counts as replaced once every pod of the new revision is Ready, it passed every enabled `verification`
gate and, for a revision never verified before, it baked (served for `verification.bake` with its ranks Healthy
and its requests no worse than the old revision's). After the last group, the revision is watched for
`postRolloutWatch` before it is recorded as verified. A failed gate, bake or watch stops the rollout until the
spec changes, or, with `autoRollback`, returns the pool to its last verified revision. `paused` holds further
replacements. `playbooks` are the spec changes the operator may make on its own, each at most once per pool,
through the same verified rollout.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.base import ApiModel
from pdfleet.operator.api.scalars import Duration, DurationOrZero


class RolloutOrder(enum.StrEnum):
    DECODE_FIRST = "DecodeFirst"
    PREFILL_FIRST = "PrefillFirst"


class MaxUnavailable(ApiModel):
    """Engine groups of each role that may be out of service at once during a rollout."""

    prefill: Annotated[int, Field(ge=1, le=1024)] = Field(default=1, description="Prefill groups at once.")
    decode: Annotated[int, Field(ge=1, le=1024)] = Field(default=1, description="Decode groups at once.")


class MaxSurge(ApiModel):
    """Engine groups of each role started above `replicas` during a rollout, so that a group of the old
    revision goes only once a new one serves in its place."""

    prefill: Annotated[int, Field(ge=0, le=1024)] = Field(
        default=0, description="Extra prefill groups at once (0: replace in place, up to maxUnavailable).")
    decode: Annotated[int, Field(ge=0, le=1024)] = Field(
        default=0, description="Extra decode groups at once (0: replace in place, up to maxUnavailable).")


class AnalysisSpec(ApiModel):
    """How a baking group is judged against the groups of the old revision of its role over the same window,
    from the counters and histograms its engines publish on /metrics (SGLang's names)."""

    min_requests: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=20, description="Requests the baking group must have finished (or aborted) in its bake before it "
                                "is judged on them; with fewer when the bake ends, it waits (up to "
                                "verification.timeout past the bake's end). Also the least a baseline needs to be "
                                "compared with.",
    )
    max_error_rate_increase: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.02, description="How much higher than the baseline's the group's share of aborted requests "
                                  "(sglang:num_aborted_requests_total over it plus sglang:num_requests_total) may "
                                  "be: 0.02 is two percentage points. Judged at every poll once minRequests are "
                                  "in, so a failing revision is stopped early.",
    )
    ttft_ratio: Annotated[float, Field(ge=1, le=100)] = Field(
        default=2.0, description="Prefill groups: the most their mean time to first token "
                                 "(sglang:time_to_first_token_seconds) may be, as a multiple of the baseline's. "
                                 "Judged at the bake's end.",
    )
    itl_ratio: Annotated[float, Field(ge=1, le=100)] = Field(
        default=2.0, description="Decode groups: the most their mean inter-token latency "
                                 "(sglang:inter_token_latency_seconds) may be, as a multiple of the baseline's. "
                                 "Judged at the bake's end.",
    )


class VerificationSpec(ApiModel):
    """Gates every engine group of a new revision passes before it counts as updated (new pools' groups too)."""

    event_loop: bool = Field(
        default=True, description="Every rank of the group reports the scheduler event loop its spec implies "
                                  "(event_loop_normal_disagg_decode after overlapSchedule: Disabled, say), as "
                                  "read from the rank agents.",
    )
    patches: bool = Field(
        default=True, description="The rank agent of every pod of the group reports the catalogue patches its "
                                  "engine applied, and they are the pool's effective set (status.patches.effective)."
                                  " Skipped, saying so, for an engine whose pdfleet runtime predates patch reports.",
    )
    server_args: bool = Field(
        default=True, description="The group's leader engine's /server_info shows the operator-owned flags the "
                                  "operator rendered for it (not every default).",
    )
    tool_call_canary: bool = Field(
        default=False, description="Each new decode group's leader engine answers a few tool-calling chat "
                                   "requests (interleaved with plain ones, streamed and not), paired with a Ready "
                                   "prefill engine as the router pairs them, with structured tool_calls and no "
                                   "DSML markup in content. Off by default: it sends real requests into the new "
                                   "engines. Needs model.toolCallParser. Prefill groups list it as Skipped (the "
                                   "answer a client reads, and any leak, comes from the decode engine).",
    )
    timeout: Duration = Field(
        default="15m", description="How long a group may take to pass its gates, from when all its pods are "
                                   "Ready (the bake's own wait for minRequests: from the bake's end); past it the "
                                   "rollout fails with GateTimedOut.",
    )
    bake: DurationOrZero = Field(
        default="5m", description="After its other gates passed, how long each group of a new revision serves "
                                  "before it counts as verified: at every poll its ranks must stay Healthy and its "
                                  "pods Ready, and its requests are compared with the old revision's groups "
                                  "(analysis). Not for a pool's first revision nor for a return to a revision "
                                  "verified before (nothing to compare with, nothing to protect). 0s switches it "
                                  "off.",
    )
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec,
                                   description="What a baking group is compared on, and how much worse it may be.")


class OverlapDesyncAction(enum.StrEnum):
    NONE = "None"
    DISABLE_OVERLAP_SCHEDULE = "DisableOverlapSchedule"


class OverlapDesyncPlaybook(ApiModel):
    """What the operator does about a Desync of a group whose ranks run SGLang's overlap event loop."""

    action: OverlapDesyncAction = Field(
        default=OverlapDesyncAction.NONE,
        description="None: the group is captured and restarted like any Desync, nothing more. "
                    "DisableOverlapSchedule: the reconcile that restarts such a group also patches "
                    "spec.engine.overlapSchedule to Disabled (and nothing else), which rolls out as usual, every "
                    "group verified on the normal loop; why is recorded in the annotation "
                    "pdfleet.dev/playbook-overlap-desync and a PlaybookOverlapDesync Warning naming the group and "
                    "its evidence ConfigMap. At most once per pool: while the annotation is there the operator "
                    "does not change overlapSchedule again (a spec that sets it back is left as it is and said "
                    "once, PlaybookOverlapDesyncReverted); removing the annotation re-arms it.",
    )


class Playbooks(ApiModel):
    """Spec changes the operator makes on its own when it recognises an incident."""

    overlap_desync: OverlapDesyncPlaybook = Field(default_factory=OverlapDesyncPlaybook,
                                                  description="A Desync on the overlap event loop.")


class RolloutSpec(ApiModel):
    """Rollout policy."""

    max_unavailable: MaxUnavailable = Field(
        default_factory=MaxUnavailable, description="Per-role disruption limit, for roles without maxSurge (or "
                                                    "whose surge group could not be scheduled).")
    max_surge: MaxSurge = Field(
        default_factory=MaxSurge,
        description="Per role: groups of the new revision started above replicas before any old group goes. The "
                    "first is the role's canary, baked while every old group still serves; after it, an old group "
                    "is deleted only while the groups that serve stay at least replicas, so serving capacity never "
                    "drops. The surge groups go once every group below replicas is verified. A surge group the "
                    "scheduler cannot place (no free GPUs) is deleted, said in a RolloutSurgeUnschedulable "
                    "Warning, and the role's rollout falls back to maxUnavailable.",
    )
    order: RolloutOrder = Field(default=RolloutOrder.DECODE_FIRST, description="Which role is replaced first.")
    verification: VerificationSpec = Field(default_factory=VerificationSpec,
                                           description="What a replaced group must show before it counts.")
    auto_rollback: bool = Field(
        default=False,
        description="When a verification gate (the bake included) fails or times out, or the revision fails its "
                    "postRolloutWatch, patch the engine-shaping part of the spec back "
                    "to the last verified revision (annotation pdfleet.dev/verified-spec) and roll that out "
                    "through the same verified path; the operator records why in the annotation "
                    "pdfleet.dev/rolled-back and a RolloutRolledBack Warning. Off: the pool holds (phase Failed) "
                    "until the spec changes.",
    )
    post_rollout_watch: DurationOrZero = Field(
        default="10m", description="After every group of a new revision baked, how long the operator still "
                                   "watches them before the revision counts as verified (RolloutVerified True, the "
                                   "record that rollback and undo return to): a group of it that turns Desync, "
                                   "Hang or Dead, or whose pod ends, in that time fails the rollout "
                                   "(WatchFailed), and with autoRollback rolls the pool back. Not after a pool's "
                                   "first revision nor a return to a verified one. 0s switches it off.",
    )
    paused: bool = Field(
        default=False,
        description="No new group replacement starts while true (replacements already started finish and are "
                    "verified); the Progressing condition says Paused. `pdfleet rollout pause|resume` set it.",
    )
    playbooks: Playbooks = Field(default_factory=Playbooks,
                                 description="Spec changes the operator makes on its own, each at most once.")
