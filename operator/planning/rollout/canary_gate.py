"""The toolCallCanary verification gate, pure: what a canary run at a decode group's leader found
(`CanaryFinding`, from the canary's `Report`), which prefill engine it is paired with, and the gate's result.

In SGLang PD the answer a client reads comes from the decode engine (its detokenizer and tool-call parser), so
any DSML leak does too: the gate judges decode groups and says, for prefill groups, that it does not apply
(Skipped, which does not hold a rollout). The requests go where the router sends them: to a Ready prefill engine
and to the decode leader together, with the same bootstrap fields. Among them, the canary's cut check: a tool
request cut by its own max_tokens inside the call must come back by the contract of docs/toolcalls.md, or the
gate fails naming how (`truncated-call`, `cut-finish-reason`, `stream-mismatch`).

A run where the engines answered too little to judge (nothing sent, or fewer than half its requests answered, or
no tool request answered) is no finding about tool calls: the gate keeps Waiting (the run is retried) until
verification.timeout turns it into TimedOut. A run whose answers are clean passes even if some requests failed:
how many a new revision fails is the bake's question (its error rate against the old revision's), and a gate
that waited on it would hold a failing revision out of the bake, serving, until the timeout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.status import GateResult, GateState
from pdfleet.operator.planning.groups import pod_ready
from pdfleet.operator.planning.rollout.toolcall_canary import SAMPLE_CHARS, Report
from pdfleet.operator.render import labels

Body = dict[str, Any]
TOOL_CALL_CANARY = "toolCallCanary"
MAX_MESSAGE = 1024  # a finding's words in the status; the gate's message field holds 2048
NOT_FOR_PREFILL = GateResult(
    name=TOOL_CALL_CANARY, state=GateState.SKIPPED,
    message="does not apply to prefill groups: in PD the answer a client reads, and any tool-call markup leaked "
            "into it, comes from the decode engine's detokenizer and parser; decode groups are checked")
SWITCHED_OFF = GateResult(name=TOOL_CALL_CANARY, state=GateState.SKIPPED, message="switched off")


@dataclasses.dataclass(frozen=True)
class CanaryFinding:
    """What one canary run at a decode leader found: PASSED, FAILED, or WAITING (inconclusive: retried)."""

    state: GateState
    message: str


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 1] + "…"


def finding(report: Report, *, prefill: str) -> CanaryFinding:
    """The gate's reading of a canary run paired with the prefill pod named `prefill`."""
    cut = f"; {report.cut_check()}" if report.cut_check() else ""
    if report.passed:
        return CanaryFinding(GateState.PASSED, _bounded(
            f"{report.tool_requests} tool request(s) answered with structured tool_calls, no DSML markup in "
            f"{report.requests} answer(s){cut} (paired with prefill {prefill})"))
    failures = report.tool_call_failures()
    if not failures:  # clean answers, some requests failed (or nothing was sent)
        if not report.errors:
            return inconclusive("; ".join(report.failures()))
        [(first, _)] = report.errors.most_common(1)
        failed = (f"{report.errors.total()} of {report.requests} request(s) failed (paired with prefill {prefill}), "
                  f"the most frequent error: {first[:SAMPLE_CHARS]}")
        answered = report.requests - report.errors.total()
        if report.answered_with_calls and 2 * answered >= report.requests:
            return CanaryFinding(GateState.PASSED, _bounded(
                f"{report.answered_with_calls} tool request(s) answered with structured tool_calls, no DSML markup "
                f"in {answered} answer(s){cut}; {failed} (their rate is the bake's to judge)"))
        return inconclusive(failed)
    what = f"{'; '.join(failures)} (of {report.requests} answers, paired with prefill {prefill})"
    samples = [f"sample ({kind}): {text[:SAMPLE_CHARS]!r}" for kind, text in sorted(report.samples.items())]
    return CanaryFinding(GateState.FAILED, _bounded("; ".join([what, *samples])))


def inconclusive(why: str) -> CanaryFinding:
    """A run that could not judge tool calls (the engines did not answer): retried."""
    return CanaryFinding(GateState.WAITING, _bounded(f"the last canary run was inconclusive, retrying: {why}"))


def pick_prefill(groups: Iterable[Sequence[Body]], role: Role = Role.PREFILL) -> Body | None:
    """The leader pod of the first prefill group (by name) whose live pods are all Ready: the engine the
    canary's requests are paired with, as the router would pair them (of any revision: during a rollout the
    router pairs new decode engines with the prefill engines there are). `role` decode: the same of decode
    groups (a prefill group's bake probes need one)."""
    candidates = []
    for pods in groups:
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        meta = [(p["metadata"].get("labels") or {}) for p in live]
        if not live or any(m.get(labels.ROLE) != role for m in meta) or not all(map(pod_ready, live)):
            continue
        leader = next((p for p, m in zip(live, meta, strict=True) if m.get(labels.RANK, "0") == "0"), None)
        if leader is not None and (leader.get("status") or {}).get("podIP"):
            candidates.append(leader)
    return min(candidates, key=lambda p: p["metadata"]["name"], default=None)


def gate(role: Role, enabled: bool, leader: Body | None, found: CanaryFinding | None) -> GateResult:
    """One group's toolCallCanary gate, from what the canary found at its current leader pod (None: not run
    yet)."""
    if not enabled:
        return SWITCHED_OFF
    if role is Role.PREFILL:
        return NOT_FOR_PREFILL
    name = leader["metadata"]["name"] if leader is not None else "the leader pod"
    if found is None:
        return GateResult(name=TOOL_CALL_CANARY, state=GateState.WAITING,
                          message=f"waiting for the tool-call canary at {name} (paired with a Ready prefill engine)")
    return GateResult(name=TOOL_CALL_CANARY, state=found.state, message=f"{name}: {found.message}")
