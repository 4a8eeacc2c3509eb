"""abort-consensus, session reaping: a session one rank still holds when its peers have reaped it on their own
clocks sends that rank into the multimodal broadcast alone; with the patch only the leader's clock reaps.

Reproduced on a real gloo group (tests/repro/session.py, 2 and 3 ranks) with SGLang 0.5.23's own intake,
`SessionController`, `Scheduler.open_session` / `close_session` and `_process_and_broadcast_mm_inputs`: the last
rank opens session `s` later than its peers (its own work inside intake), so its deadline is later; the next turn
for `s` arrives once rank 0 has reaped it, and is aborted on the ranks that reaped it and built on the last rank,
which enters the broadcast's `broadcast_object_list` without them. gloo pairs it with rank 0's next request
broadcast and fails it as a collective mismatch: the group dies. Patched, rank 0 alone picks the reap and its
broadcast carries it as a `CloseSessionReqInput`: every rank closes `s` in the same iteration and aborts the turn.
Then the reap's route against SGLang's own `SessionController`, without a process group.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from pdfleet.runtime.patches.impl import abort_consensus
from tests.repro import group, session
from tests.support import requires
from tests.unit.test_desync_reproduction import (  # the harness's launcher fixture and its verdict checks
    STARTUP_S,
    Launch,
    _assert_every_rank_completes_healthy,
    _in_loop,
    _log,
)

AC = abort_consensus
PATCH = AC.PATCH_ID
ALL_FIXES = ("kv-poll-lockstep", PATCH, "health-check-consensus", "retraction-consensus", "admission-consensus",
             "flush-consensus")
ITERATIONS = 60  # at the 0.1 s idle pause, several seconds past the session's timeout on every rank
RUN_S = 120


def _start(launch: Launch, world: int, patches: tuple[str, ...]) -> tuple[Any, Any]:
    requires.installed("sglang")
    sc, proc = launch(patches, world, module="tests.repro.session", iterations=ITERATIONS, arrivals={},
                      local_aborts={}, idle_s=0.1)
    if not group.wait_for(lambda: _in_loop(sc)() or proc.poll() is not None, timeout_s=STARTUP_S):
        pytest.fail(f"the ranks did not enter their loop in {STARTUP_S} s:\n{_log(sc)}")
    return sc, proc


@pytest.mark.parametrize("world", [2, 3])
def test_unpatched_a_rank_that_reaps_a_session_later_builds_its_next_turn_alone(launch: Launch, world: int) -> None:
    sc, proc = _start(launch, world, ())
    assert group.wait_for(lambda: proc.poll() is not None, timeout_s=RUN_S), f"still running:\n{_log(sc)}"
    log = _log(sc)
    assert proc.returncode != 0, f"the group survived a session reaped on one clock:\n{log}"
    turns = [session.turn_path(sc, rank).read_text().split(" at ")[0] for rank in range(world)]
    assert turns == [f"aborted {session.TURN}"] * (world - 1) + [f"built {session.TURN}"], (turns, log)
    assert "collective mismatch" in log or "Connection reset by peer" in log, log


@pytest.mark.parametrize(("world", "patches"), [(2, (PATCH,)), (3, (PATCH,)), (3, ALL_FIXES)])
def test_patched_every_rank_reaps_the_session_in_the_same_iteration_on_the_leaders_clock(
        launch: Launch, world: int, patches: tuple[str, ...]) -> None:
    sc, proc = _start(launch, world, patches)
    _assert_every_rank_completes_healthy(sc, proc)
    results = [json.loads(sc.result_path(rank).read_text()) for rank in range(world)]
    sent = results[0]["sent"]
    assert len(sent) == 1, results[0]
    for result in results:
        assert result["applied"] == list(patches)
        assert result["built"] == {}, result
        assert result["aborted"] == {session.TURN: sent[0]}, result
        assert result["gone"] == results[0]["gone"] and result["gone"], result
        assert result["broadcast_results"] == []


# --- the reap's route, on SGLang's own SessionController ------------------------------------------------------

def test_a_reap_already_on_its_way_is_not_queued_again() -> None:
    assert AC.new_reaps(["a", "b", "b", "c"], queued=["a"], sent=["c"]) == ["b"]
    assert AC.new_reaps([], queued=[], sent=[]) == []


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> Callable[..., dict[str, Any]]:
    """The patch's replacements over SGLang's own `SessionController.maybe_reap`, `get_parallel` answering for a
    rank that is (`decider=True`) or is not the deciding one; `clock` is the session module's clock."""
    requires.installed("sglang")
    from sglang.srt import runtime_context
    from sglang.srt.session import session_controller as module

    clock = [100.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])

    def build(decider: bool) -> dict[str, Any]:
        rank = 0 if decider else 1
        monkeypatch.setattr(runtime_context, "get_parallel",
                            lambda: SimpleNamespace(pp_rank=0, attn_tp_rank=rank, attn_cp_rank=0))
        originals = {AC.ABORT_REQUEST: lambda self, req: None, AC.PROCESS_INPUT_REQUESTS: lambda self, reqs: None,
                     AC.POLL_TIMEOUT_ABORTS: lambda self: [], AC.MAYBE_REAP: module.SessionController.maybe_reap}
        return {"new": AC.replacements(originals), "clock": clock, "module": module}

    return build


def _controller(module: Any, released: list[str]) -> Any:
    from sglang.srt.managers.io_struct import OpenSessionReqInput

    controller = module.SessionController(tree_cache=SimpleNamespace(
        release_radix_session=released.append, release_session=lambda sid: None))
    for sid in ("old", "young"):
        assert controller.open(OpenSessionReqInput(capacity_of_str_len=64, session_id=sid, timeout=5.0)).success
    return controller


@pytest.mark.parametrize("decider", [True, False])
def test_only_the_deciding_rank_picks_a_reap_and_no_rank_closes_a_session_itself(
        patched: Callable[..., dict[str, Any]], decider: bool) -> None:
    from sglang.srt.managers.io_struct import CloseSessionReqInput

    env = patched(decider)
    new, clock = env["new"], env["clock"]
    released: list[str] = []
    controller = _controller(env["module"], released)
    controller.sessions["young"].last_active_time = 103.0  # active later: its deadline is 108
    controller.sessions["young"].close_on_finish = True  # a close was asked while a turn ran
    controller.sessions["young"].req_nodes = {"r": SimpleNamespace(req=SimpleNamespace(finished=lambda: False))}
    scheduler = SimpleNamespace(session_controller=controller)

    clock[0] = 106.0  # past "old"'s deadline (105), before "young"'s; "young"'s turn is still running
    new[AC.MAYBE_REAP](controller, clock[0])
    assert set(controller.sessions) == {"old", "young"}, "picked, not closed: the broadcast closes it"
    assert controller.sessions["young"].close_on_finish is True, "SGLang's reset of the flag is put back"
    assert released == []
    broadcast = new[AC.POLL_TIMEOUT_ABORTS](scheduler)
    assert broadcast == ([CloseSessionReqInput(session_id="old")] if decider else [])
    # The next iteration's reap (its interval passed) runs before the broadcast is applied: not picked again.
    clock[0] = 107.5
    new[AC.MAYBE_REAP](controller, clock[0])
    assert new[AC.POLL_TIMEOUT_ABORTS](scheduler) == []
    if decider:  # every rank applies the broadcast with SGLang's own close
        controller.close(broadcast[0])
        assert set(controller.sessions) == {"young"} and released == ["old"]
