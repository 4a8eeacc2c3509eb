"""The agent serves the records real rank processes write, and its report feeds the verdict."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdfleet.runtime.health import agent, report, verdict

_RANK = """
import sys
from pdfleet.runtime.health import attach, phases
P = phases.Phase
path, slot, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
w = attach.attach_rank(slot=slot, rank=10 + slot, slots=2, path=path)
w.set_loop(phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE)
for _ in range(steps):
    w.collective(P.RECV_BROADCAST); w.begin(P.FORWARD); w.step()
w.collective(P.KV_POLL_ALL_REDUCE)
sys.stdin.read()  # stay alive until the test lets go
"""

POLICY = verdict.HealthPolicy.from_seconds(desync_after=30, hang_after=300)


@pytest.fixture
def spawn(ledger_path: Path) -> Iterator[Callable[[int, int], subprocess.Popen[str]]]:
    children: list[subprocess.Popen[str]] = []

    def start(slot: int, steps: int) -> subprocess.Popen[str]:
        child = subprocess.Popen(
            [sys.executable, "-c", _RANK, str(ledger_path), str(slot), str(steps)], stdin=subprocess.PIPE, text=True
        )
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()
        child.wait()


def wait_for(fetch: Callable[[], Any], done: Callable[[Any], bool], timeout_s: float = 30.0) -> Any:
    """Fetch until `done` holds; fail with the last value after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fetch()
        if done(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s}s; last value: {value}")
        time.sleep(0.01)


def _ranks(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/ranks")
    response.raise_for_status()
    return response.json()


def test_before_any_rank_starts_the_agent_serves_no_ranks(served: httpx.Client, ledger_path: Path) -> None:
    body = _ranks(served)

    assert body["ranks"] == []
    assert body["ledger"] == str(ledger_path)
    assert body["now_ns"] > 0


def test_the_agent_serves_the_records_rank_processes_write(served: httpx.Client, spawn) -> None:
    children = [spawn(0, 5), spawn(1, 7)]

    body = wait_for(lambda: _ranks(served), lambda b: [r["collectives"] for r in b["ranks"]] == [6, 8])

    first, second = body["ranks"]
    assert first | {"phase_age_ns": 0, "phase_since_ns": 0, "pid_start": 0, "attached_ns": 0} == {
        "slot": 0,
        "rank": 10,
        "pid": children[0].pid,
        "alive": True,
        "consistent": True,
        "loop": "event_loop_normal_disagg_decode",
        "phase": "kv_poll_all_reduce",
        "collective": True,
        "phase_since_ns": 0,
        "phase_age_ns": 0,
        "iteration": 5,
        "collectives": 6,
        "stack_signal": 12,
        "pid_start": 0,
        "attached_ns": 0,
    }
    assert (second["rank"], second["iteration"], second["pid"]) == (11, 7, children[1].pid)
    assert 0 <= first["phase_age_ns"] < 60 * 10**9


def test_a_rank_whose_process_died_is_served_as_not_alive_and_judged_dead(served: httpx.Client, spawn) -> None:
    survivor, victim = spawn(0, 3), spawn(1, 3)
    wait_for(lambda: _ranks(served), lambda b: len(b["ranks"]) == 2)
    victim.kill()
    victim.wait()

    body = wait_for(lambda: _ranks(served), lambda b: not b["ranks"][1]["alive"])

    views = report.rank_views([report.from_json(body)], expected=[10, 11])
    v = verdict.judge(views, POLICY)
    assert (v.health, v.reason) == (verdict.Health.DEAD, "rank 11: process gone")
    assert body["ranks"][0]["pid"] == survivor.pid
    assert body["ranks"][0]["alive"]


_ENDING = """
import sys
from pdfleet.runtime.health import attach, phases
P = phases.Phase
path, slot, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
w = attach.attach_rank(slot=slot, rank=10 + slot, slots=2, path=path)
w.collective(P.RECV_BROADCAST); w.begin(P.FORWARD); w.step()
w.collective(P.KV_POLL_ALL_REDUCE)
sys.stdin.readline()  # the test says when to end
if how == "clean":  # the loop ended as asked (as the instrumented dispatcher does on SGLang's ShutdownReq)
    w.close()
    sys.exit(0)
if how == "crash":  # an exception out of the loop: nothing tidies the record up
    raise RuntimeError("NCCL error in the loop")
sys.stdin.read()  # "kill": held until SIGKILLed
"""


def _ending(ledger_path: Path, slot: int, how: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _ENDING, str(ledger_path), str(slot), how],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _end(child: subprocess.Popen[str]) -> int:
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    child.stdin.close()
    return child.wait(30)


def test_ranks_that_exit_cleanly_are_served_as_exited_and_judged_stopped_not_dead(
        served: httpx.Client, ledger_path: Path) -> None:
    children = [_ending(ledger_path, slot, "clean") for slot in range(2)]
    wait_for(lambda: _ranks(served), lambda b: [r["phase"] for r in b["ranks"]] == ["kv_poll_all_reduce"] * 2)

    assert [_end(child) for child in children] == [0, 0]
    body = wait_for(lambda: _ranks(served), lambda b: not any(r["alive"] for r in b["ranks"]))

    assert [(r["phase"], r["stack_signal"]) for r in body["ranks"]] == [("exited", 0)] * 2
    assert all(r["phase_since_ns"] > r["attached_ns"] for r in body["ranks"])  # when each one exited
    views = report.rank_views([report.from_json(body)], expected=[10, 11])
    assert [v.status for v in views] == [verdict.RankStatus.EXITED] * 2
    v = verdict.judge(views, POLICY)
    assert (v.health, v.reason) == (verdict.Health.STOPPED, "ranks 10,11: exited cleanly")


def test_a_rank_that_crashes_out_of_its_loop_or_is_sigkilled_is_still_judged_dead(
        served: httpx.Client, ledger_path: Path) -> None:
    crashing, killed = _ending(ledger_path, 0, "crash"), _ending(ledger_path, 1, "kill")
    wait_for(lambda: _ranks(served), lambda b: len(b["ranks"]) == 2 and all(r["phase"] != "starting"
                                                                             for r in b["ranks"]))
    assert _end(crashing) == 1
    assert crashing.stderr is not None and "NCCL error in the loop" in crashing.stderr.read()
    killed.kill()
    killed.wait()
    for pipe in (crashing.stderr, killed.stdin, killed.stderr):
        assert pipe is not None
        pipe.close()

    body = wait_for(lambda: _ranks(served), lambda b: not any(r["alive"] for r in b["ranks"]))

    assert [r["phase"] for r in body["ranks"]] == ["kv_poll_all_reduce"] * 2
    views = report.rank_views([report.from_json(body)], expected=[10, 11])
    v = verdict.judge(views, POLICY)
    assert (v.health, v.reason) == (verdict.Health.DEAD, "ranks 10,11: process gone")


def test_ranks_at_different_collective_counts_are_served_so_the_verdict_can_see_it(served: httpx.Client, spawn) -> None:
    spawn(0, 5)
    spawn(1, 6)

    body = wait_for(lambda: _ranks(served), lambda b: [r["collectives"] for r in b["ranks"]] == [6, 7])

    views = report.rank_views([report.from_json(body)], expected=[10, 11])
    assert [(v.collectives, v.status) for v in views] == [(6, "reporting"), (7, "reporting")]
    # Fresh: between steps for now. Held past desync_after it is a desync (see test_verdict).
    assert verdict.judge(views, POLICY).health is verdict.Health.HEALTHY
    tight = verdict.HealthPolicy(desync_after_ns=1, hang_after_ns=1)
    assert verdict.judge(views, tight).health is verdict.Health.DESYNC


def test_an_unknown_path_is_a_404(served: httpx.Client) -> None:
    response = served.get("/nope")

    assert response.status_code == 404
    assert response.json() == {"error": "no such path: /nope"}


def test_a_report_survives_the_json_round_trip(served: httpx.Client, spawn) -> None:
    spawn(0, 2)
    body = wait_for(lambda: _ranks(served), lambda b: len(b["ranks"]) == 1)

    assert report.to_json(report.from_json(body)) == body


def test_a_body_that_is_not_a_report_is_refused() -> None:
    with pytest.raises(ValueError, match="not an agent report"):
        report.from_json({"ranks": [{"slot": 0}]})


def test_report_views_mark_missing_and_unreachable_ranks() -> None:
    empty = report.PodReport(ledger="/dev/shm/x", now_ns=1, ranks=())

    views = report.rank_views([empty], expected=[0, 1, 2], unreachable=[2])

    assert [v.status for v in views] == ["absent", "absent", "unreachable"]


def test_the_agent_names_the_pod_it_runs_in_from_the_downward_api(ledger_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(agent.POD_UID_ENV, "6f1c2d3e-pod")
    with agent.Agent(ledger_path, host="127.0.0.1", port=0) as a, \
            httpx.Client(base_url=f"http://127.0.0.1:{a.port}") as client:
        assert _ranks(client)["pod_uid"] == "6f1c2d3e-pod"
    monkeypatch.delenv(agent.POD_UID_ENV)
    with agent.Agent(ledger_path, host="127.0.0.1", port=0) as a, \
            httpx.Client(base_url=f"http://127.0.0.1:{a.port}") as client:
        assert "pod_uid" not in _ranks(client)
