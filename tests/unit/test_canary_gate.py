"""The toolCallCanary verification gate: its judging (`planning.rollout.canary_gate`, pure), its place among the gates
(`verification.verify`), the runner that runs the canary once per decode leader (`engines.canary_runner`), and the
health monitor's wiring, against engines on loopback that answer chat requests as SGLang's OpenAI server does
(the engine simulator's tool-call answers, `runtime.simulator.toolcalls`), paired prefill and decode."""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from pdfleet.operator import metrics
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.rollout import VerificationSpec
from pdfleet.operator.api.status import GateState, Verdict
from pdfleet.operator.controller import Controller
from pdfleet.operator.engines import canary_runner
from pdfleet.operator.engines.canary_runner import CanaryRunner, Target
from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.rollout import canary_gate, verification
from pdfleet.operator.planning.rollout.canary_gate import CanaryFinding
from pdfleet.operator.planning.rollout.toolcall_canary import Report
from pdfleet.operator.planning.rollout.verification import EngineFacts
from pdfleet.operator.render import labels
from pdfleet.runtime.simulator import toolcalls
from pdfleet.runtime.simulator.faults import Fault
from tests.support.fake_engines import FakeEngine
from tests.support.fake_fleet import DECODE, IPS, KEY, PODS, PREFILL, Fleet, engine_servers, rendered_fleet
from tests.unit.test_verification import NORMAL_DECODE, NOW, _ready_pod

Body = dict[str, Any]
PASSED = CanaryFinding(GateState.PASSED, "4 tool request(s) answered with structured tool_calls")
LEAKED = CanaryFinding(GateState.FAILED, "DSML markup in content (parser-off) in 4 answer(s)")


# --- judging a run ----------------------------------------------------------------------------------------------


def report(**fields: Any) -> Report:
    out = Report(requests=8, tool_requests=4, plain_requests=4)
    for name, value in fields.items():
        setattr(out, name, value)
    return out


def test_a_clean_run_passes_and_says_what_it_sent_and_where() -> None:
    found = canary_gate.finding(report(structured_calls=4, answered_with_calls=4), prefill="p-0-0")
    assert found.state is GateState.PASSED
    assert found.message == ("4 tool request(s) answered with structured tool_calls, no DSML markup in 8 answer(s) "
                             "(paired with prefill p-0-0)")


def test_a_leak_fails_naming_its_cause_with_a_bounded_excerpt_of_the_leaked_text() -> None:
    leaked = '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">' + "x" * 5000
    found = canary_gate.finding(report(leaks=collections.Counter({"parser-off": 4}), samples={"parser-off": leaked},
                                       errors=collections.Counter({"timed out": 1})), prefill="p-0-0")
    assert found.state is GateState.FAILED
    assert found.message.startswith("DSML markup in content (parser-off) in 4 answer(s) (of 8 answers, paired with "
                                    "prefill p-0-0); sample (parser-off): '<｜DSML｜function_calls>")
    assert "timed out" not in found.message, "errors are not what the gate fails on"
    assert len(found.message) <= canary_gate.MAX_MESSAGE


def test_many_causes_stay_within_the_status_fields_bound() -> None:
    causes = {f"cause-{i}": 1 for i in range(100)}
    found = canary_gate.finding(report(leaks=collections.Counter(causes),
                                       samples={c: "<｜DSML｜" + "y" * 200 for c in causes}), prefill="p")
    assert found.state is GateState.FAILED and len(found.message) == canary_gate.MAX_MESSAGE
    assert found.message.endswith("…")


@pytest.mark.parametrize(("fields", "failure"), [
    ({"malformed": 1, "samples": {"malformed": "get_weather: arguments are not JSON"}},
     "1 malformed structured tool call(s)"),
    ({"unanswered": 2}, "2 tool request(s) answered without tool_calls"),
])
def test_malformed_or_missing_calls_fail_too(fields: Body, failure: str) -> None:
    found = canary_gate.finding(report(**fields), prefill="p")
    assert found.state is GateState.FAILED and found.message.startswith(failure)


def test_clean_answers_pass_though_some_requests_failed_which_the_bake_judges() -> None:
    found = canary_gate.finding(report(structured_calls=3, answered_with_calls=3,
                                       errors=collections.Counter({"HTTP 500 InternalServerError": 3})), prefill="p")
    assert found.state is GateState.PASSED
    assert found.message == ("3 tool request(s) answered with structured tool_calls, no DSML markup in 5 answer(s); "
                             "3 of 8 request(s) failed (paired with prefill p), the most frequent error: HTTP 500 "
                             "InternalServerError (their rate is the bake's to judge)")
    too_few = canary_gate.finding(report(structured_calls=1, answered_with_calls=1,
                                         errors=collections.Counter({"timed out": 5})), prefill="p")
    assert too_few.state is GateState.WAITING, "fewer than half the requests answered: too little to judge"


@pytest.mark.parametrize(("cause", "failure"), [
    ("truncated-call", "a call cut by max_tokens came back with arguments that are not a JSON object "
                       "(truncated-call) in 2 answer(s)"),
    ("cut-finish-reason", "an answer cut by max_tokens inside its call ended with finish_reason tool_calls, not "
                          "length (cut-finish-reason) in 2 answer(s)"),
    ("stream-mismatch", "the streamed and non-streamed answers cut at the same max_tokens differ (stream-mismatch) "
                        "in 2 pair(s)"),
])
def test_a_call_cut_by_max_tokens_against_the_contract_fails_naming_how(cause: str, failure: str) -> None:
    found = canary_gate.finding(report(structured_calls=4, answered_with_calls=4, requests=10, cut_requests=2,
                                       cut_max_tokens=20, cut=collections.Counter({cause: 2}),
                                       samples={cause: 'get_weather: {"city": "Pa'}), prefill="p")
    assert found.state is GateState.FAILED
    assert found.message == (f"{failure} (of 10 answers, paired with prefill p); sample ({cause}): "
                             "'get_weather: {\"city\": \"Pa'")


def test_a_passing_run_says_what_its_cut_check_did() -> None:
    kept = canary_gate.finding(report(structured_calls=4, answered_with_calls=4, requests=10, cut_requests=2,
                                      cut_max_tokens=20), prefill="p")
    assert kept.state is GateState.PASSED
    assert kept.message == ("4 tool request(s) answered with structured tool_calls, no DSML markup in 10 answer(s); "
                            "2 answer(s) cut inside the call by max_tokens 20, kept to the contract (paired with "
                            "prefill p)")
    unsent = canary_gate.finding(report(structured_calls=4, answered_with_calls=4,
                                        cut_not_sent="the reference tool request failed (timed out)"), prefill="p")
    assert unsent.state is GateState.PASSED
    assert "in 8 answer(s); no cut probe sent: the reference tool request failed (timed out) (paired" in unsent.message


@pytest.mark.parametrize(("fields", "says"), [
    ({"errors": collections.Counter({"HTTP 503 InternalServerError": 6, "timed out": 2})},
     "8 of 8 request(s) failed (paired with prefill p), the most frequent error: HTTP 503 InternalServerError"),
    ({"requests": 0, "tool_requests": 0, "plain_requests": 0}, "no request was sent"),
])
def test_a_run_that_judged_no_answer_is_inconclusive_and_waits(fields: Body, says: str) -> None:
    found = canary_gate.finding(report(**fields), prefill="p")
    assert found.state is GateState.WAITING
    assert found.message == f"the last canary run was inconclusive, retrying: {says}"


# --- the gate ---------------------------------------------------------------------------------------------------


def test_the_gate_is_skipped_when_off_and_for_prefill_groups_and_judged_for_decode_ones() -> None:
    leader = _ready_pod("u1")
    assert canary_gate.gate(Role.DECODE, False, leader, LEAKED) == canary_gate.SWITCHED_OFF
    prefill = canary_gate.gate(Role.PREFILL, True, leader, LEAKED)
    assert prefill.state is GateState.SKIPPED and prefill.message.startswith("does not apply to prefill groups")
    assert canary_gate.gate(Role.DECODE, True, leader, None).state is GateState.WAITING
    failed = canary_gate.gate(Role.DECODE, True, leader, LEAKED)
    assert (failed.state, failed.message) == (GateState.FAILED, f"p-u1: {LEAKED.message}")


HEALTHY = GroupHealth(Verdict.HEALTHY, NORMAL_DECODE, "", 1, answered=True)
INFO = {"tp_size": 1, "disable_overlap_schedule": False, "disable_tokenizer_batch_decode": False}
ON = VerificationSpec(tool_call_canary=True)


def verify(role: Role, canary: dict[str, CanaryFinding], *, pods: frozenset[str] = frozenset({"u1"}),
           now: Any = NOW) -> verification.Outcome:
    pod = _ready_pod("u1")
    facts = EngineFacts(pods=pods, server_info={"u1": INFO}, canary=canary)
    return verification.verify(ON, role=role, expected_loop=NORMAL_DECODE, revision="r2", ready=True,
                               want_flags=[("--tp-size", "1")], pods=[pod], before=None, health=HEALTHY, facts=facts,
                               now=now)


def canary_state(outcome: verification.Outcome) -> str:
    assert outcome.verification is not None
    return next(str(g.state) for g in outcome.verification.gates if g.name == "toolCallCanary")


@pytest.mark.effect("spec.rollout.verification.toolCallCanary")
@pytest.mark.parametrize(("role", "canary", "state", "verified", "stopped"), [
    (Role.DECODE, {"u1": PASSED}, "Passed", True, False),
    (Role.DECODE, {"u1": LEAKED}, "Failed", False, True),
    (Role.DECODE, {}, "Waiting", False, False),
    (Role.DECODE, {"u0": PASSED}, "Waiting", False, False),  # another pod's run says nothing of this one
    (Role.DECODE, {"u1": canary_gate.inconclusive("HTTP 503")}, "Waiting", False, False),
    (Role.PREFILL, {}, "Skipped", True, False),
])
def test_the_canary_gate_among_the_others(role: Role, canary: dict[str, CanaryFinding], state: str,
                                          verified: bool, stopped: bool) -> None:
    outcome = verify(role, canary)
    assert canary_state(outcome) == state
    assert outcome.verified is verified
    assert (outcome.stopped is not None and outcome.stopped.name == "toolCallCanary") is stopped


def test_a_finding_about_other_pods_than_the_group_has_is_not_taken() -> None:
    assert canary_state(verify(Role.DECODE, {"u1": LEAKED}, pods=frozenset({"u0"}))) == "Waiting"


def test_a_canary_that_never_concludes_times_out() -> None:
    import datetime

    late = verify(Role.DECODE, {"u1": canary_gate.inconclusive("connection failed")},
                  now=NOW + datetime.timedelta(minutes=15))
    assert late.stopped is not None and late.stopped.state is GateState.TIMED_OUT
    assert "the last canary run was inconclusive, retrying: connection failed" in late.stopped.message


def pod(name: str, role: str, *, rank_: str = "0", ready: bool = True, ip: str | None = "127.0.0.9",
        deleting: bool = False) -> Body:
    meta: Body = {"name": name, "uid": name, "labels": {labels.ROLE: role, labels.RANK: rank_}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T12:00:00Z"
    return {"metadata": meta, "status": {"podIP": ip, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}


def test_the_canary_pairs_with_the_leader_of_a_ready_prefill_group() -> None:
    groups = [
        [pod("d-0-0", "decode")],
        [pod("p-0-0", "prefill", ready=False)],
        [pod("p-1-0", "prefill", ip=None)],
        [pod("p-2-0", "prefill", deleting=True)],
        [pod("p-4-1", "prefill", rank_="1"), pod("p-4-0", "prefill")],
        [pod("p-3-0", "prefill"), pod("p-3-1", "prefill", rank_="1", ready=False)],
    ]
    chosen = canary_gate.pick_prefill(groups)
    assert chosen is not None and chosen["metadata"]["name"] == "p-4-0"
    assert canary_gate.pick_prefill(groups[:4]) is None


# --- the runner -------------------------------------------------------------------------------------------------


def target(uid: str) -> Target:
    return Target(decode_uid=uid, decode_ip="127.0.0.1", decode_port=1, prefill_name="p", prefill_ip="127.0.0.1",
                  prefill_port=1, bootstrap_port=2, model="m", parser="deepseekv32")


def passed_runs() -> float:
    return metrics.REGISTRY.get_sample_value("pdfleet_toolcall_canary_runs_total", {"result": "Passed"}) or 0.0


async def test_the_runner_runs_once_per_pod_retries_an_inconclusive_run_and_forgets_gone_pods() -> None:
    clock = [0.0]
    answers: dict[str, CanaryFinding] = {"u1": PASSED, "u2": canary_gate.inconclusive("refused")}
    started: list[str] = []
    done: list[Any] = []
    held = asyncio.Event()

    async def run(t: Target) -> CanaryFinding:
        started.append(t.decode_uid)
        if t.decode_uid == "u3":
            await held.wait()
        return answers[t.decode_uid]

    passed_before = passed_runs()
    runner = CanaryRunner(done=done.append, retry_s=15, run=lambda t: asyncio.ensure_future(run(t)),
                          clock=lambda: clock[0])
    for uid in ("u1", "u2", "u3"):
        runner.ensure(KEY, target(uid))
        runner.ensure(KEY, target(uid))  # under way: not twice
    await asyncio.sleep(0)  # the tasks run (u3 holds)
    await asyncio.sleep(0)
    assert runner.findings(KEY, {"u1", "u2", "u3"}) == {"u1": PASSED, "u2": answers["u2"]}
    assert done == [KEY, KEY]
    assert passed_runs() == passed_before + 1
    runner.ensure(KEY, target("u1"))
    runner.ensure(KEY, target("u2"))  # inconclusive, but too soon
    clock[0] = 15
    runner.ensure(KEY, target("u1"))
    runner.ensure(KEY, target("u2"))  # retried now
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sorted(started) == ["u1", "u2", "u2", "u3"]

    assert runner.findings(KEY, {"u2"}) == {"u2": answers["u2"]}  # u1 gone; u3's run cancelled
    held.set()
    await asyncio.sleep(0)
    assert runner.findings(KEY, {"u2", "u3"}) == {"u2": answers["u2"]}
    await runner.close()


async def test_a_bug_in_a_run_is_an_inconclusive_finding_not_a_failure() -> None:
    async def run(_: Target) -> CanaryFinding:
        raise RuntimeError("boom")

    done: list[Any] = []
    runner = CanaryRunner(done=done.append, run=lambda t: asyncio.ensure_future(run(t)))
    runner.ensure(KEY, target("u1"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    [found] = runner.findings(KEY, {"u1"}).values()
    assert found.state is GateState.WAITING and "RuntimeError: boom" in found.message
    await runner.close()


# --- the monitor, with engines that answer chat requests --------------------------------------------------------


class ChatEngine(FakeEngine):
    """`/server_info`, and SGLang's `/v1/models` and `/v1/chat/completions` with the engine simulator's tool-call
    answers under `fault`; every chat body it got is kept in `chats`."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.fault = Fault.NONE
        self.chats: list[Body] = []

    def routes(self, app: web.Application) -> None:
        super().routes(app)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny-model", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.chats.append(body)
        tool = toolcalls.answer(body, parser="deepseekv32", fault=self.fault, plain_alongside=True) \
            if toolcalls.is_tool_request(body) else None
        finish = tool.finish_reason if tool else "length"
        if not body.get("stream"):
            message = toolcalls.message(tool) if tool else {"role": "assistant", "content": "the sea is calm"}
            return web.json_response({"id": "r", "object": "chat.completion", "created": 0, "model": body["model"],
                                      "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        deltas = toolcalls.stream_deltas(tool) if tool else [{"content": "the sea"}]
        for delta, end in [*((d, None) for d in deltas), ({}, finish)]:
            chunk = {"id": "r", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                     "choices": [{"index": 0, "delta": delta, "finish_reason": end}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, ChatEngine]]:
    async with engine_servers(ChatEngine) as servers:
        yield servers


@pytest.fixture
async def fleet(engines: dict[str, ChatEngine]) -> AsyncIterator[Fleet]:
    async with rendered_fleet(engines, model__toolCallParser="deepseekv32",
                              rollout__verification__toolCallCanary=True) as fleet:
        yield fleet


async def poll_until_the_canary_found(fleet: Fleet, timeout: float = 20.0) -> CanaryFinding:
    """Polls as the monitor's loop would (a finished run wakes it), until the decode group's facts carry a
    finding."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await fleet.monitor.poll(KEY)
        found = dict(fleet.monitor.facts(KEY)[DECODE].canary)
        if found:
            [finding] = found.values()
            return finding
        await asyncio.sleep(0.05)
    raise AssertionError("no canary finding within the timeout")


def gates(fleet: Fleet, group: str) -> dict[str, Body]:
    pool = fleet.kube.get("InferencePool", *KEY)
    assert pool is not None
    found = next(g for g in pool["status"]["groups"] if g["name"] == group)
    return {g["name"]: g for g in found["verification"]["gates"]}


def wired(fleet: Fleet) -> Controller:
    return Controller(client=fleet.kube, cache=fleet.kube.cache(), health=fleet.monitor.health,
                      engines=fleet.monitor.facts)


async def test_the_monitor_runs_the_canary_at_the_decode_leader_paired_with_a_prefill_engine(
        fleet: Fleet, engines: dict[str, ChatEngine]) -> None:
    finding = await poll_until_the_canary_found(fleet)
    assert finding.state is GateState.PASSED, finding.message
    prefill, decode = engines[PREFILL].chats, engines[DECODE].chats
    assert len(decode) == 8 and len(prefill) == 8, "each request went to both, as the router sends it"
    spec_bootstrap = 8998
    assert {(c["bootstrap_host"], c["bootstrap_port"]) for c in decode} == {(IPS[PREFILL], spec_bootstrap)}
    assert sorted(c["bootstrap_room"] for c in decode) == sorted(c["bootstrap_room"] for c in prefill)
    assert len({c["bootstrap_room"] for c in decode}) == 8
    assert sum(1 for c in decode if c.get("tools")) == 4 and {c["model"] for c in decode} == {"qwen2.5-0.5b-instruct"}

    await wired(fleet).reconcile(KEY)
    decode_gates, prefill_gates = gates(fleet, DECODE), gates(fleet, PREFILL)
    assert decode_gates["toolCallCanary"]["state"] == "Passed"
    assert decode_gates["toolCallCanary"]["message"].startswith(f"{PODS[DECODE]}: 4 tool request(s) answered")
    assert prefill_gates["toolCallCanary"]["state"] == "Skipped"

    await fleet.monitor.poll(KEY)
    assert len(engines[DECODE].chats) == 8, "once per pod"


async def test_a_leaking_decode_engine_fails_the_gate_and_the_rollout_holds(
        fleet: Fleet, engines: dict[str, ChatEngine]) -> None:
    engines[DECODE].fault = Fault.LEAK_PARSER_OFF
    finding = await poll_until_the_canary_found(fleet)
    assert finding.state is GateState.FAILED
    await wired(fleet).reconcile(KEY)
    gate = gates(fleet, DECODE)["toolCallCanary"]
    assert gate["state"] == "Failed"
    assert gate["message"].startswith(f"{PODS[DECODE]}: DSML markup in content (parser-off) in 4 answer(s)")
    assert "sample (parser-off): '<｜DSML｜function_calls>" in gate["message"]
    [warning] = fleet.events("RolloutGateFailed")
    assert "gate toolCallCanary failed for decode group tiny-decode-0" in warning["message"]


async def test_no_canary_runs_without_the_gate_or_in_a_group_verified_at_its_revision(
        fleet: Fleet, engines: dict[str, ChatEngine], monkeypatch: pytest.MonkeyPatch) -> None:
    await poll_until_the_canary_found(fleet)
    await wired(fleet).reconcile(KEY)  # verified: every gate passed
    pool = fleet.kube.get("InferencePool", *KEY)
    assert pool is not None
    assert all(g["verifiedRevision"] == g["revision"] for g in pool["status"]["groups"])
    runs: list[Target] = []
    real = canary_runner.run_once

    def counted(client: EngineClient, t: Target) -> Any:
        runs.append(t)  # a run starts synchronously, within the poll
        return real(client, t)

    monkeypatch.setattr(canary_runner, "run_once", counted)
    fleet.monitor.forget(KEY)  # as after an operator restart: nothing kept in memory
    await fleet.monitor.poll(KEY)
    assert runs == [], "a group verified at the revision it runs is not asked again"

    fleet.kube.update("InferencePool", *KEY, lambda p: p["status"]["groups"][0].pop("verifiedRevision") and
                      p["status"]["groups"][1].pop("verifiedRevision"))
    fleet.kube.update("InferencePool", *KEY,
                      lambda p: p["spec"]["rollout"]["verification"].update(toolCallCanary=False))
    await fleet.monitor.poll(KEY)
    assert runs == [], "switched off"
    assert fleet.monitor.facts(KEY)[DECODE].canary == {}

    fleet.kube.update("InferencePool", *KEY,
                      lambda p: p["spec"]["rollout"]["verification"].update(toolCallCanary=True))
    await fleet.monitor.poll(KEY)
    assert [t.decode_uid for t in runs] == [pod_uid(fleet, DECODE)], "the control: unverified and on, it runs"


def pod_uid(fleet: Fleet, group: str) -> str:
    found = fleet.kube.get("Pod", KEY[0], PODS[group])
    assert found is not None
    return str(found["metadata"]["uid"])
