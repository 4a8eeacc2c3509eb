"""flush-consensus: a deferred cache flush one rank gives up while its peers run it desyncs the group in the grammar
all-gather; with the patch every rank flushes together.

Reproduced on a real gloo group (tests/repro/flush.py, 2 and 3 ranks) with SGLang 0.5.23's own intake,
`SchedulerFlushWrapper`, `Scheduler.flush_cache`, `is_fully_idle`, `GrammarManager` and decode's
`_get_new_prebuilt_batch`: a flush requested with a timeout while every rank is busy is deferred by each rank on
its own clock; the last rank reads its clock late (its own work inside intake) and gives the flush up, its peers
flush once idle. A request with the grammar the last rank kept cached is then admitted there at once and queued
on its peers, which enter the grammar queue's `all_gather_object` alone: pdfleet's verdict is Desync, the last
rank in `recv_broadcast`, its peers in `grammar_ready_gather`. Patched, the ranks agree their idleness and the
leader's deadline, all flush in the same iteration and the grammar request is queued, gathered and admitted
alike: Healthy.

Then the decision as tables, the patched wrapper against a simulated peer (no process group), and the install on
the installed SGLang.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches import base, catalogue, registry, targets
from pdfleet.runtime.patches.impl import flush_consensus
from tests.repro import flush, group
from tests.repro.scenario import SGLANG_VERSION
from tests.support import patched_sglang, requires
from tests.unit.test_desync_reproduction import (  # the harness's launcher fixture and its verdict checks
    STARTUP_S,
    Launch,
    _assert_desync_is_detected_in_time,
    _assert_every_rank_completes_healthy,
    _in_loop,
    _log,
    labels,
)

FC = flush_consensus
PATCH = FC.PATCH_ID
ALL_FIXES = ("kv-poll-lockstep", "abort-consensus", "health-check-consensus", "retraction-consensus",
             "admission-consensus", PATCH)
ITERATIONS = 16
Phase = phases.Phase


# Every rank: `plain` and `g-first` admitted at 0 (`g-first` after the grammar all-gather), the deferred flush run
# and answered when all are idle, `g-again` missing the flushed cache and admitted after the all-gather.
IDLE_AT = flush.DECODE_STEPS
AGREED = {"admitted": {"plain": 0, "g-first": 0, "g-again": flush.AGAIN_AT},
          "queued": {"g-first": 0, "g-again": flush.AGAIN_AT}, "flushed": [IDLE_AT], "replies": [[IDLE_AT, True]],
          "collectives_entered": labels(Phase.RECV_BROADCAST, Phase.FLUSH_AGREEMENT, Phase.GRAMMAR_READY_GATHER)}
CASES: dict[str, tuple[int, tuple[str, ...], Phase | dict[str, Any]]] = {
    "world2-unpatched": (2, (), Phase.GRAMMAR_READY_GATHER),
    "world3-unpatched": (3, (), Phase.GRAMMAR_READY_GATHER),
    "world2-flush-consensus": (2, (PATCH,), AGREED),
    "world3-flush-consensus": (3, (PATCH,), AGREED),
    "world3-all-fixes": (3, ALL_FIXES, AGREED),
}


@pytest.mark.parametrize(("world", "patches", "outcome"), list(CASES.values()), ids=list(CASES))
def test_a_deferred_flush_one_rank_gives_up_desyncs_the_grammar_gather_unless_the_ranks_agree_it(
        launch: Launch, world: int, patches: tuple[str, ...], outcome: Phase | dict[str, Any]) -> None:
    requires.installed("sglang")
    sc, proc = launch(patches, world, module="tests.repro.flush", iterations=ITERATIONS, arrivals={},
                      local_aborts={})
    if not group.wait_for(lambda: _in_loop(sc)() or proc.poll() is not None, timeout_s=STARTUP_S):
        pytest.fail(f"the ranks did not enter their loop in {STARTUP_S} s:\n{_log(sc)}")
    if isinstance(outcome, Phase):
        _assert_desync_is_detected_in_time(sc, proc, outcome, early=world - 1)
        assert "Deferred flush_cache timed out" in _log(sc), "the last rank gave the flush up"
        return
    _assert_every_rank_completes_healthy(sc, proc)
    for rank in range(world):
        result = json.loads(sc.result_path(rank).read_text())
        assert result["iterations"] == sc.iterations
        assert result["applied"] == list(patches)
        assert {key: result[key] for key in outcome} == outcome, f"rank {rank}"


# --- the decision ---------------------------------------------------------------------------------------------

def _min_over(peers_by_group: dict[str, list[list[int]]]) -> tuple[Callable[..., list[int]], list[Any]]:
    """A reduction over named groups; `peers_by_group` holds the other ranks' votes in each group."""
    calls: list[tuple[str, list[int]]] = []

    def reduce_min(votes: Sequence[int], group: str) -> list[int]:
        calls.append((group, list(votes)))
        return [min(column) for column in zip(votes, *peers_by_group[group], strict=True)]

    return reduce_min, calls


def test_the_votes_are_the_smallest_over_every_group_carried_from_attention_tp_into_cp() -> None:
    reduce_min, calls = _min_over({"attn_tp": [[1, 1]], "attn_cp": [[0, 1]]})
    assert FC.agree([1, 1], ["attn_tp", "attn_cp"], reduce_min) == [0, 1]
    assert calls == [("attn_tp", [1, 1]), ("attn_cp", [1, 1])]
    assert FC.agree([0, 1], [], reduce_min) == [0, 1], "no peer: the rank's own answer"


@pytest.mark.parametrize(("leader", "now", "vote"), [
    (True, 9.0, 1),  # the leader, before its deadline (10.0)
    (True, 10.0, 0),  # the leader, at it: SGLang's `time.monotonic() >= deadline` has passed
    (False, 99.0, 1),  # any other rank votes the MIN's neutral value, whatever its clock says
])
def test_only_the_leader_reads_its_clock(leader: bool, now: float, vote: int) -> None:
    read: list[bool] = []

    def clock() -> float:
        read.append(True)
        return now

    assert FC.in_time_vote(leader=leader, deadline=10.0, now=clock) == vote
    assert read == ([True] if leader else [])


@pytest.mark.parametrize("in_time", [True, False])
def test_the_agreed_deadline_reads_as_the_agreed_answer_on_any_clock(in_time: bool) -> None:
    for now in (-1e18, 0.0, 1e18):
        assert (now >= FC.agreed_deadline(in_time)) is (not in_time)  # SGLang's check in check_pending
    assert math.isinf(FC.agreed_deadline(in_time))


# --- the patched wrapper against a simulated peer ---------------------------------------------------------------

class _Scheduler:
    """What the patched wrapper reads of its scheduler; `flush_cache` and `is_fully_idle` answer as SGLang's would
    for a rank that is `idle`, and `flushable` by flush_cache's own check (the engine is paused, so that check
    ignores waiting requests that hold no KV)."""

    def __init__(self, idle: bool, flushable: bool | None = None) -> None:
        self.idle, self.flushable = idle, idle if flushable is None else flushable
        self.tp_cpu_group, self._engine_paused = "tp", True
        self.flushes: list[bool] = []
        self.replies: list[Any] = []

    def is_fully_idle(self, for_health_check: bool = False, ignore_waiting: bool = False) -> bool:
        return self.flushable if ignore_waiting else self.idle

    def flush_cache(self, empty_cache: bool = True) -> bool:
        self.flushes.append(self.flushable)
        return self.flushable

    def send_control_output(self, output: Any, recv_req: Any) -> None:
        self.replies.append(output)


class _Writer(seams.UNATTACHED.__class__):  # type: ignore[misc]
    def __init__(self) -> None:
        self.entered: list[phases.Phase] = []

    def collective(self, phase: phases.Phase) -> None:
        self.entered.append(phase)


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch, restore_sglang: None) -> Callable[..., Any]:
    """Installs the patch; `patched(scheduler, peer=[votes], rank=N, size=N)` is a SchedulerFlushWrapper built as
    Scheduler.init_running_status builds it, whose agreement reduces against one peer's `votes`. Returns the
    wrapper; `wrapper.reduced` lists this rank's votes, `wrapper.writer.entered` the marked collectives."""
    import sglang.srt.runtime_context as runtime_context
    import torch.distributed as dist
    from sglang.srt.managers.scheduler_components.flush_wrapper import SchedulerFlushWrapper

    # Before the install, which binds get_parallel.
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(attn_dp_enabled=False))
    base.apply((PATCH,), SGLANG_VERSION, registry.implementations((PATCH,)))

    def build(scheduler: _Scheduler, peer: list[int] | None, rank: int = 1) -> Any:
        reduced: list[list[int]] = []

        def all_min(votes: Sequence[int], group: Any) -> list[int]:
            reduced.append(list(votes))
            return [min(a, b) for a, b in zip(votes, peer or votes, strict=True)]

        monkeypatch.setattr(FC.gloo_min, "all_min", all_min)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1 if peer is None else 2)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
        writer = _Writer()
        monkeypatch.setattr(seams, "_writer", writer)
        wrapper = SchedulerFlushWrapper(flush_cache=scheduler.flush_cache, is_fully_idle=scheduler.is_fully_idle,
                                        send_output=scheduler.send_control_output)
        wrapper.reduced, wrapper.writer = reduced, writer  # type: ignore[attr-defined]
        return wrapper

    return build


@pytest.fixture
def restore_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    patched_sglang.restore_after_test(monkeypatch, ALL_FIXES)


def _flush(timeout_s: float | None) -> Any:
    from sglang.srt.managers.io_struct import FlushCacheReqInput

    return FlushCacheReqInput(timeout_s=timeout_s)


@pytest.mark.parametrize(("me", "peer", "timeout_s", "flushed", "pending"), [
    (_Scheduler(idle=True), [1, 1], 5.0, [True], False),  # every rank idle: all flush at once
    (_Scheduler(idle=True), [0, 0], 5.0, [], True),  # a busy peer: this idle rank defers too
    (_Scheduler(idle=True), [1, 0], None, [], False),  # immediate: a peer flush_cache would refuse, so all refuse
    (_Scheduler(idle=False), [1, 1], None, [], False),  # immediate, this rank busy: its idle peers refuse too
    (_Scheduler(idle=True), [1, 1], None, [True], False),
])
def test_a_flush_request_is_run_deferred_or_refused_by_every_rank_alike(
        patched: Callable[..., Any], me: _Scheduler, peer: list[int], timeout_s: float | None,
        flushed: list[bool], pending: bool) -> None:
    me.flushes.clear()
    wrapper = patched(me, peer)
    out = wrapper.handle(_flush(timeout_s))
    assert me.flushes == flushed
    assert (wrapper._pending is not None) is pending
    assert out is None if pending else out.success is bool(flushed)
    assert wrapper.reduced == [[int(me.idle), int(me.flushable)]]
    assert wrapper.writer.entered == [Phase.FLUSH_AGREEMENT]


def test_a_pending_flush_times_out_on_every_rank_when_the_leaders_deadline_passes(
        patched: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1, not the leader, whose own deadline has not passed: the leader's vote (0, passed) times it out."""
    me = _Scheduler(idle=False)
    wrapper = patched(me, [1, 0], rank=1)
    assert wrapper.handle(_flush(60.0)) is None
    wrapper.check_pending()
    assert wrapper._pending is None and me.flushes == []
    [reply] = me.replies
    assert reply.success is False and reply.message == "Timed out waiting for idle state."
    assert wrapper.reduced[-1] == [0, 1], "this rank voted busy, and 'in time' without reading its clock"


def test_a_rank_whose_own_deadline_passed_keeps_waiting_while_the_leader_is_in_time(
        patched: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    me = _Scheduler(idle=False)
    wrapper = patched(me, [1, 1], rank=1)
    assert wrapper.handle(_flush(60.0)) is None
    request, _ = wrapper._pending
    wrapper._pending = (request, -1.0)  # this rank's clock alone says the deadline passed
    wrapper.check_pending()
    assert wrapper._pending == (request, -1.0), "still pending, with this rank's own deadline kept"
    assert me.replies == [] and me.flushes == []
    me.idle = me.flushable = True
    wrapper.check_pending()  # every rank idle now: all flush and answer
    assert wrapper._pending is None and me.flushes == [True] and me.replies[0].success is True


def test_the_leader_reads_its_own_clock_for_the_group(patched: Callable[..., Any]) -> None:
    me = _Scheduler(idle=False)
    wrapper = patched(me, [1, 1], rank=0)
    assert wrapper.handle(_flush(60.0)) is None
    request, _ = wrapper._pending
    wrapper._pending = (request, -1.0)  # the leader's deadline passed
    wrapper.check_pending()
    assert wrapper._pending is None and me.replies[0].success is False
    assert wrapper.reduced[-1] == [0, 0]


def test_no_collective_without_a_flush_or_without_a_peer(patched: Callable[..., Any]) -> None:
    me = _Scheduler(idle=False)
    wrapper = patched(me, [1, 1])
    wrapper.check_pending()  # every iteration without a pending flush
    assert wrapper.reduced == [] and wrapper.writer.entered == []
    alone = patched(me, None)  # a group of one: SGLang's own decisions
    assert alone.handle(_flush(60.0)) is None
    alone.check_pending()
    assert alone.reduced == [] and alone.writer.entered == [] and alone._pending is not None


# --- the patch against the installed SGLang ------------------------------------------------------------------

def test_the_catalogue_the_registry_and_the_fingerprints_name_the_same_targets() -> None:
    requires.installed("sglang")
    assert catalogue.BY_ID[PATCH].targets == FC.TARGETS
    assert set(FC.FINGERPRINTS[SGLANG_VERSION]) == set(FC.TARGETS)
    assert registry.MODULES[PATCH] == FC.__name__
    for dotted, expected in FC.FINGERPRINTS[SGLANG_VERSION].items():
        assert targets.verify(dotted, expected).function is not None


def test_the_wrapper_is_handed_the_schedulers_own_bound_methods() -> None:
    """The patch reads the scheduler from the wrapper's `_flush_cache` (a bound method), and agrees the check
    `flush_cache` makes: both as SGLang 0.5.23 wires and writes them."""
    requires.installed("sglang")
    from sglang.srt.managers.scheduler import Scheduler

    wiring = inspect.getsource(Scheduler.init_running_status)
    assert "SchedulerFlushWrapper(\n            flush_cache=self.flush_cache,\n" \
           "            is_fully_idle=self.is_fully_idle," in wiring
    assert "if self.is_fully_idle(ignore_waiting=self._engine_paused):" in inspect.getsource(Scheduler.flush_cache)


def test_every_desync_fix_installs_together(restore_sglang: None) -> None:
    applied = base.apply(ALL_FIXES, SGLANG_VERSION, registry.implementations(ALL_FIXES))
    assert [a.id for a in applied] == list(ALL_FIXES)
    for dotted in (FC.HANDLE, FC.CHECK_PENDING):
        assert targets.resolve(dotted).function.__pdfleet_patch__ == PATCH
    for dotted in (FC.WRAPPER_INIT, FC.FLUSH_CACHE, FC.INIT_RUNNING_STATUS):
        assert getattr(targets.resolve(dotted).function, "__pdfleet_patch__", None) is None, "fingerprinted only"


def test_a_changed_target_is_refused_and_nothing_is_installed(restore_sglang: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.managers.scheduler_components.flush_wrapper import SchedulerFlushWrapper

    def __init__(self: Any, *, flush_cache: Any, is_fully_idle: Any, send_output: Any) -> None:
        self._pending = None  # a release that no longer keeps the scheduler's callables

    monkeypatch.setattr(SchedulerFlushWrapper, "__init__", __init__)
    before = inspect.getattr_static(SchedulerFlushWrapper, "handle")
    with pytest.raises(base.PatchError, match=r"SchedulerFlushWrapper\.__init__ is not the function"):
        base.apply((PATCH,), SGLANG_VERSION, registry.implementations((PATCH,)))
    assert inspect.getattr_static(SchedulerFlushWrapper, "handle") is before
