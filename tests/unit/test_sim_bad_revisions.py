"""The simulator's bad revisions: faults that pass a rollout's first checks and break once the engine serves (a
desync or a crash after a delay or after some requests, a share of requests failing, slower answers), asked for
through the environment as `spec.engine.env` would. Pure parts first, then real engines behind the launcher."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import pytest

from pdfleet.runtime.health import verdict
from pdfleet.runtime.simulator import faults
from pdfleet.runtime.simulator.faults import Asked, Fault
from tests.support import sim_engine
from tests.support.sim_engine import SimEngine, until
from tests.unit.test_engine_simulator import POLICY, views


def test_the_delay_settings_are_read_from_env_and_annotations_alike() -> None:
    env = faults.from_env({"PDFLEET_SIM_FAULT": "desync", "PDFLEET_SIM_FAULT_AFTER_S": "20",
                           "PDFLEET_SIM_FAULT_AFTER_REQUESTS": "5"})
    assert (env.fault, env.after_s, env.after_requests, env.delayed) == (Fault.DESYNC, 20.0, 5, True)
    noted = faults.from_annotations({"sim.pdfleet.dev/fault": "failing", "sim.pdfleet.dev/fail-share": "0.25"})
    assert noted is not None and (noted.fault, noted.fail_share, noted.delayed) == (Fault.FAILING, 0.25, False)
    slow = faults.from_env({"PDFLEET_SIM_FAULT": "slow-requests"})
    assert slow.latency_factor == faults.DEFAULT_LATENCY_FACTOR
    for bad in ({"PDFLEET_SIM_FAIL_SHARE": "1.5"}, {"PDFLEET_SIM_LATENCY_FACTOR": "0.5"},
                {"PDFLEET_SIM_FAULT_AFTER_S": "-1"}, {"PDFLEET_SIM_FAULT_AFTER_S": "soon"}):
        with pytest.raises(ValueError, match="PDFLEET_SIM_"):
            faults.from_env({"PDFLEET_SIM_FAULT": "failing", **bad})


def test_a_delayed_fault_is_handed_over_only_once_its_time_and_requests_have_come() -> None:
    now, sent, applied = [0.0], [0], []
    env = {"PDFLEET_SIM_FAULT": "desync", "PDFLEET_SIM_FAULT_AFTER_S": "10", "PDFLEET_SIM_FAULT_AFTER_REQUESTS": "3"}
    watcher = faults.Watcher(env, applied.append, requests=lambda: sent[0], clock=lambda: now[0])
    assert watcher.poll_once() == Asked()
    now[0] = 11.0
    assert watcher.poll_once() == Asked(), "time has come, the requests have not"
    sent[0] = 3
    assert watcher.poll_once().fault is Fault.DESYNC
    assert [a.fault for a in applied] == [Fault.NONE, Fault.DESYNC]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SimEngine]]:
    tmp = tmp_path_factory.mktemp("bad-revisions")
    started = {
        "good": sim_engine.start(tmp, "null", tp=1),
        "failing": sim_engine.start(tmp, "null", tp=1, env={"PDFLEET_SIM_FAULT": "failing",
                                                              "PDFLEET_SIM_FAIL_SHARE": "0.25"}),
        "slow": sim_engine.start(tmp, "null", tp=1, env={"PDFLEET_SIM_FAULT": "slow-requests",
                                                           "PDFLEET_SIM_LATENCY_FACTOR": "4",
                                                           "PDFLEET_SIM_PREFILL_BASE_MS": "200",
                                                           "PDFLEET_SIM_DECODE_MS": "50"}),
        "desync-later": sim_engine.start(tmp, "null", env={"PDFLEET_SIM_FAULT": "desync",
                                                            "PDFLEET_SIM_FAULT_AFTER_REQUESTS": "3"}),
        "crash-later": sim_engine.start(tmp, "null", tp=1, env={"PDFLEET_SIM_FAULT": "crash",
                                                                 "PDFLEET_SIM_FAULT_AFTER_REQUESTS": "2"}),
    }
    with sim_engine.serving(started):
        yield started


def generate(engine: SimEngine, n: int, tokens: int = 4) -> httpx.Response:
    return httpx.post(engine.url + "/generate", json={"text": f"request {n}", "sampling_params": {
        "max_new_tokens": tokens}}, timeout=30)


def test_failing_answers_its_share_of_requests_with_a_500(engines: dict[str, SimEngine]) -> None:
    codes = [generate(engines["failing"], n).status_code for n in range(1, 13)]
    assert codes == [200, 200, 200, 500] * 3
    assert all(generate(engines["good"], n).status_code == 200 for n in range(4))


def test_slow_requests_take_the_factor_longer_to_first_token_and_between_tokens(
        engines: dict[str, SimEngine]) -> None:
    started = time.monotonic()
    r = generate(engines["slow"], 1, tokens=3)
    took = time.monotonic() - started
    assert r.status_code == 200
    # A prefill of 200 ms taken 4 times (0.8 s), and each of the two decode steps 3 x 50 ms longer (0.3 s): what
    # the factor adds is slept for certain; the steps' own ticks may come sooner than a full step after a wait.
    assert took >= 1.1, took


def test_a_desync_after_some_requests_leaves_the_engine_healthy_until_then(engines: dict[str, SimEngine]) -> None:
    engine = engines["desync-later"]
    for n in range(2):
        assert generate(engine, n).status_code == 200
    time.sleep(1.0)  # longer than the policy's desync_after: a desync now would be judged
    assert verdict.judge(views(engine), POLICY).health is verdict.Health.HEALTHY
    with contextlib.suppress(httpx.ReadTimeout):  # it may finish before the ranks diverge
        httpx.post(engine.url + "/generate", json={"text": "the third"}, timeout=3)
    until(lambda: verdict.judge(views(engine), POLICY).health is verdict.Health.DESYNC,
          time.monotonic() + 15, "a Desync verdict after the third request")


def test_a_crash_after_some_requests_ends_the_engine_with_a_non_zero_exit(engines: dict[str, SimEngine]) -> None:
    engine = engines["crash-later"]
    assert generate(engine, 1).status_code == 200
    assert engine.process.poll() is None, "the engine serves until the fault is due"
    with contextlib.suppress(httpx.TransportError):  # the crash may cut this very request
        generate(engine, 2)
    assert engine.process.wait(30) != 0
    assert "crashing, as the crash fault asks" in engine.log.read_text()
