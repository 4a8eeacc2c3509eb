"""The verdict for one group, case by case: the failures pdfleet exists for, and what must not trip it."""

from __future__ import annotations

import pytest

from pdfleet.runtime.health import phases, report, verdict
from pdfleet.runtime.health.verdict import Health, RankStatus, RankView

P = phases.Phase
S = 1_000_000_000
POLICY = verdict.HealthPolicy.from_seconds(desync_after=30, hang_after=300)


def rank(n: int, phase: P, collectives: int, age_s: float, iteration: int = 100, **kw: object) -> RankView:
    return RankView(
        rank=n,
        status=RankStatus.REPORTING,
        phase=phase,
        phase_age_ns=int(age_s * S),
        collectives=collectives,
        iteration=iteration,
        **kw,  # type: ignore[arg-type]
    )


def test_the_overlap_abort_failure_is_a_desync_once_it_outlasts_desync_after() -> None:
    ranks = [
        rank(0, P.KV_POLL_ALL_REDUCE, 3121, 45),
        rank(1, P.KV_POLL_ALL_REDUCE, 3121, 45),
        rank(2, P.RECV_BROADCAST, 3121, 44),
        rank(3, P.RECV_BROADCAST, 3121, 44),
    ]

    v = verdict.judge(ranks, POLICY)

    assert v.health is Health.DESYNC
    assert v.held_ns == 44 * S
    assert "ranks 0,1 in kv_poll_all_reduce at collective 3121" in v.reason
    assert "ranks 2,3 in recv_broadcast at collective 3121" in v.reason


def test_ranks_at_different_collective_counts_for_long_are_a_desync() -> None:
    ranks = [rank(0, P.RECV_BROADCAST, 3122, 40, 1041), rank(1, P.RECV_BROADCAST, 3121, 40, 1040)]

    v = verdict.judge(ranks, POLICY)

    assert v.health is Health.DESYNC
    assert v.reason.startswith("ranks diverged for 40.0s: rank 0 in recv_broadcast at collective 3122")


def test_the_same_divergence_seen_early_is_healthy_ranks_between_steps() -> None:
    ranks = [rank(0, P.KV_POLL_ALL_REDUCE, 3121, 45), rank(1, P.RECV_BROADCAST, 3121, 0.002)]

    assert verdict.judge(ranks, POLICY).health is Health.HEALTHY


def test_a_divergence_held_exactly_desync_after_is_not_yet_a_desync() -> None:
    ranks = [rank(0, P.KV_POLL_ALL_REDUCE, 7, 30), rank(1, P.RECV_BROADCAST, 7, 30)]

    assert verdict.judge(ranks, POLICY).health is Health.HEALTHY


def test_a_forward_that_takes_minutes_on_every_rank_is_healthy() -> None:
    ranks = [rank(n, P.FORWARD, 500, 600, 80) for n in range(8)]

    v = verdict.judge(ranks, POLICY)

    assert v.health is Health.HEALTHY
    assert "all ranks together for 600.0s" in v.reason


def test_the_end_of_a_long_forward_caught_mid_way_is_healthy() -> None:
    ranks = [rank(0, P.RECV_BROADCAST, 501, 0.0001, 81), rank(1, P.FORWARD, 500, 600, 80)]

    assert verdict.judge(ranks, POLICY).health is Health.HEALTHY


def test_all_ranks_waiting_in_one_collective_past_hang_after_is_a_hang() -> None:
    ranks = [rank(n, P.KV_POLL_ALL_REDUCE, 42, 301 + n) for n in range(4)]

    v = verdict.judge(ranks, POLICY)

    assert v.health is Health.HANG
    assert v.reason == (
        "all 4 ranks blocked for 301.0s: ranks 0,1,2,3 in kv_poll_all_reduce at collective 42 (iteration 100)"
    )


def test_all_ranks_waiting_in_one_collective_under_hang_after_is_healthy() -> None:
    ranks = [rank(n, P.RECV_BROADCAST, 42, 100) for n in range(4)]

    assert verdict.judge(ranks, POLICY).health is Health.HEALTHY


def test_a_dead_rank_makes_the_group_dead_whatever_the_others_do() -> None:
    ranks = [
        rank(0, P.KV_POLL_ALL_REDUCE, 9, 1000),
        RankView(rank=1, status=RankStatus.DEAD, phase=P.FORWARD, pid=77),
        RankView(rank=2, status=RankStatus.UNREACHABLE),
    ]

    v = verdict.judge(ranks, POLICY)

    assert (v.health, v.reason) == (Health.DEAD, "rank 1: process gone")


def exited(n: int, *, alive: bool = False) -> RankView:
    """A rank whose record ends in a clean exit (`report.rank_views` makes it EXITED, alive or not)."""
    return RankView(rank=n, status=RankStatus.EXITED, phase=P.EXITED, phase_age_ns=2 * S, pid=70 + n)


def test_a_group_whose_ranks_all_exited_cleanly_is_stopped_not_dead() -> None:
    v = verdict.judge([exited(1), exited(0)], POLICY)

    assert (v.health, v.reason, v.held_ns) == (Health.STOPPED, "ranks 0,1: exited cleanly", 0)


@pytest.mark.parametrize(("other", "words"), [
    (rank(1, P.KV_POLL_ALL_REDUCE, 9, 1000), "rank 1: still in the loop"),
    (RankView(rank=1, status=RankStatus.DEAD, phase=P.FORWARD, pid=77), "rank 1: process gone"),
    (RankView(rank=1, status=RankStatus.UNREACHABLE), "rank 1: agent not answering"),
    (RankView(rank=1, status=RankStatus.ABSENT), "rank 1: never attached"),
], ids=["a peer not out of its loop yet", "a peer killed by the shutdown's clean-up", "a pod already gone",
        "a rank that never attached"])
def test_one_clean_exit_makes_the_group_stopped_whatever_its_peers_show_during_the_shutdown(
        other: RankView, words: str) -> None:
    """Only a shutdown exits a rank cleanly: the peers' state is the same stop seen at another instant, so
    neither a Dead nor a Desync verdict (which would capture and restart a group being stopped)."""
    v = verdict.judge([exited(0), other], POLICY)

    assert (v.health, v.reason) == (Health.STOPPED, f"rank 0: exited cleanly; {words}")


def test_a_rank_gone_without_a_clean_exit_is_still_dead_beside_healthy_peers() -> None:
    ranks = [rank(0, P.FORWARD, 9, 1), RankView(rank=1, status=RankStatus.DEAD, phase=P.KV_POLL_ALL_REDUCE, pid=7)]

    assert verdict.judge(ranks, POLICY).health is Health.DEAD


def test_an_unreachable_pod_makes_the_group_unreachable() -> None:
    ranks = [rank(0, P.FORWARD, 9, 1), RankView(rank=1, status=RankStatus.UNREACHABLE)]

    assert verdict.judge(ranks, POLICY).health is Health.UNREACHABLE


@pytest.mark.parametrize(
    "waiting",
    [RankView(rank=1, status=RankStatus.ABSENT), rank(1, P.STARTING, 0, 900, 0)],
    ids=["never attached", "attached, loading"],
)
def test_a_rank_not_yet_in_its_loop_makes_the_group_starting(waiting: RankView) -> None:
    ranks = [rank(0, P.RECV_BROADCAST, 1, 900, 0), waiting]

    v = verdict.judge(ranks, POLICY)

    assert (v.health, v.reason) == (Health.STARTING, "rank 1: not in the event loop yet")


def test_no_ranks_at_all_is_starting() -> None:
    assert verdict.judge([], POLICY).health is Health.STARTING


def test_the_evidence_lists_every_rank_in_rank_order_with_its_loop() -> None:
    loop = phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE
    ranks = [rank(1, P.IDLE, 3, 0.1, loop=loop), rank(0, P.IDLE, 3, 0.1, loop=loop)]

    v = verdict.judge(ranks, POLICY)

    assert [r.rank for r in v.ranks] == [0, 1]
    assert {r.loop for r in v.ranks} == {loop}


def test_a_policy_with_a_zero_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        verdict.HealthPolicy.from_seconds(desync_after=0, hang_after=300)


def _agent_rank(n: int, phase_label: str, collectives: int, age_s: float) -> dict[str, object]:
    return {"slot": n, "rank": n, "pid": 100 + n, "alive": True, "loop": "event_loop_overlap_disagg_decode",
            "phase": phase_label, "phase_since_ns": 0, "phase_age_ns": int(age_s * S), "iteration": 9,
            "collectives": collectives}


def _judge_agent_answer(*labels: str) -> verdict.Verdict:
    body = {"ledger": "/dev/shm/l", "now_ns": 1, "ranks": [_agent_rank(0, labels[0], 12, 40),
                                                          _agent_rank(1, labels[1], 12, 40)]}
    return verdict.judge(report.rank_views([report.from_json(body)], expected=[0, 1]), POLICY)


def test_a_desync_read_from_an_agent_names_the_audited_collective_a_rank_waits_in() -> None:
    v = _judge_agent_answer(P.PREALLOC_HANDSHAKE_POLL.label, P.RECV_BROADCAST.label)

    assert v.health is Health.DESYNC
    assert "rank 0 in prealloc_handshake_poll at collective 12" in v.reason
    assert "rank 1 in recv_broadcast at collective 12" in v.reason


def test_a_collective_label_the_operator_does_not_know_still_reads_as_a_desync_without_its_name() -> None:
    # An engine newer than the operator: its label decodes to UNKNOWN, a position of its own.
    v = _judge_agent_answer("a_collective_from_the_future", P.RECV_BROADCAST.label)

    assert v.health is Health.DESYNC
    assert "rank 0 in unknown at collective 12" in v.reason


def _judge_stuck_in(label: str, **extra: object) -> verdict.Verdict:
    ranks = [_agent_rank(n, label, 12, 400) | extra for n in (0, 1)]
    body = {"ledger": "/dev/shm/l", "now_ns": 1, "ranks": ranks}
    return verdict.judge(report.rank_views([report.from_json(body)], expected=[0, 1]), POLICY)


def test_a_group_stuck_in_a_collective_the_operator_does_not_know_is_a_hang_when_the_agent_says_collective() -> None:
    # An engine newer than the operator marks each phase collective or not; the operator needs no name for it.
    body = {"ledger": "/dev/shm/l", "now_ns": 1,
            "ranks": [_agent_rank(0, P.PREALLOC_HANDSHAKE_EXCHANGE.label, 12, 1), _agent_rank(1, P.LOCAL.label, 12, 1)]}
    assert [r["collective"] for r in report.to_json(report.from_json(body))["ranks"]] == [True, False]
    stuck = _judge_stuck_in("a_collective_from_the_future", collective=True)
    assert stuck.health is Health.HANG, stuck.reason
    assert "other_collective" in stuck.reason
    # Without the flag (an older agent) the unknown phase is not known to be a place ranks wait.
    assert _judge_stuck_in("a_collective_from_the_future").health is not Health.HANG
