"""Properties of the verdict that must hold for every group, not just the cases we thought of."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from pdfleet.runtime.health import phases, verdict
from pdfleet.runtime.health.verdict import Health, RankStatus, RankView

P = phases.Phase
S = 1_000_000_000
LOOP_PHASES = [p for p in P if p not in (P.UNKNOWN, P.STARTING, P.EXITED)]
COMPUTE_PHASES = [p for p in LOOP_PHASES if not p.is_collective]

policies = st.builds(
    lambda d, h: verdict.HealthPolicy(desync_after_ns=d, hang_after_ns=h),
    st.integers(1, 600 * S),
    st.integers(1, 3600 * S),
)
ages = st.integers(0, 30 * 24 * 3600 * S)


def _view(rank: int, phase: P, collectives: int, age: int, iteration: int = 0) -> RankView:
    return RankView(
        rank=rank,
        status=RankStatus.REPORTING,
        phase=phase,
        phase_age_ns=age,
        collectives=collectives,
        iteration=iteration,
    )


@st.composite
def together(draw: st.DrawFn, phase: st.SearchStrategy[P]) -> list[RankView]:
    """All ranks at one position, each for its own time in it (they entered it at different instants)."""
    n = draw(st.integers(1, 16))
    where, count, iteration = draw(phase), draw(st.integers(0, 2**40)), draw(st.integers(0, 2**40))
    return [_view(r, where, count, draw(ages), iteration) for r in range(n)]


@st.composite
def diverged(draw: st.DrawFn) -> list[RankView]:
    """Ranks at two or more different positions."""
    n = draw(st.integers(2, 16))
    positions = draw(
        st.lists(st.tuples(st.sampled_from(LOOP_PHASES), st.integers(0, 2**40)), min_size=2, max_size=n, unique=True)
    )
    assigned = positions + [draw(st.sampled_from(positions)) for _ in range(n - len(positions))]
    order = draw(st.permutations(range(n)))
    return [_view(order[i], phase, count, draw(ages)) for i, (phase, count) in enumerate(assigned)]


def _aged(views: list[RankView], *, at_least: int | None = None, youngest: int | None = None) -> list[RankView]:
    out = [dataclasses.replace(v, phase_age_ns=max(v.phase_age_ns, at_least or 0)) for v in views]
    if youngest is not None:
        out[0] = dataclasses.replace(out[0], phase_age_ns=youngest)
    return out


@given(together(st.sampled_from(COMPUTE_PHASES)), policies)
def test_ranks_together_outside_collectives_are_healthy_however_slow(views: list[RankView], policy) -> None:
    assert verdict.judge(views, policy).health is Health.HEALTHY


@given(together(st.sampled_from(LOOP_PHASES)), st.data(), policies)
def test_ranks_making_progress_at_one_position_are_never_desync_or_hang(
    views: list[RankView], data: st.DataObject, policy
) -> None:
    # Progress: the latest phase change (on some rank) is within hang_after.
    youngest = data.draw(st.integers(0, policy.hang_after_ns))
    assert verdict.judge(_aged(views, youngest=youngest), policy).health is Health.HEALTHY


@given(together(st.sampled_from(LOOP_PHASES)), st.data(), policies)
def test_a_step_in_progress_is_never_desync_or_hang(views: list[RankView], data: st.DataObject, policy) -> None:
    # Some ranks have just moved on to the next position (within both thresholds); the rest are still
    # where all of them were, for however long.
    movers = data.draw(st.integers(1, len(views)))
    next_phase = data.draw(st.sampled_from(LOOP_PHASES))
    moved_for = st.integers(0, min(policy.desync_after_ns, policy.hang_after_ns))
    stepped = [
        dataclasses.replace(
            v,
            phase=next_phase,
            collectives=v.collectives + (1 if next_phase.is_collective else 0),
            iteration=v.iteration + 1,
            phase_age_ns=data.draw(moved_for),
        )
        if i < movers
        else v
        for i, v in enumerate(views)
    ]
    assert verdict.judge(stepped, policy).health not in (Health.DESYNC, Health.HANG)


@given(diverged(), st.data(), policies)
def test_any_divergence_held_past_desync_after_is_a_desync(views: list[RankView], data: st.DataObject, policy) -> None:
    past = data.draw(st.integers(policy.desync_after_ns + 1, policy.desync_after_ns + 30 * 24 * 3600 * S))
    assert verdict.judge(_aged(views, at_least=past), policy).health is Health.DESYNC


@given(diverged(), st.data(), policies)
def test_a_divergence_younger_than_desync_after_is_not_a_desync(
    views: list[RankView], data: st.DataObject, policy
) -> None:
    youngest = data.draw(st.integers(0, policy.desync_after_ns))
    assert verdict.judge(_aged(views, youngest=youngest), policy).health is not Health.DESYNC


@given(together(st.sampled_from([p for p in LOOP_PHASES if p.is_collective])), st.data(), policies)
def test_ranks_held_in_one_collective_past_hang_after_are_a_hang(
    views: list[RankView], data: st.DataObject, policy
) -> None:
    past = data.draw(st.integers(policy.hang_after_ns + 1, policy.hang_after_ns + 30 * 24 * 3600 * S))
    assert verdict.judge(_aged(views, at_least=past), policy).health is Health.HANG


@given(st.one_of(diverged(), together(st.sampled_from(LOOP_PHASES))), st.data(), policies)
def test_a_dead_rank_is_always_reported_as_dead(views: list[RankView], data: st.DataObject, policy) -> None:
    victim = data.draw(st.integers(0, len(views) - 1))
    views[victim] = dataclasses.replace(views[victim], status=RankStatus.DEAD)
    assert verdict.judge(views, policy).health is Health.DEAD


@given(st.one_of(diverged(), together(st.sampled_from(LOOP_PHASES))), st.randoms(), policies)
def test_the_verdict_does_not_depend_on_the_order_ranks_arrive_in(views: list[RankView], rnd, policy) -> None:
    shuffled = list(views)
    rnd.shuffle(shuffled)
    assert verdict.judge(shuffled, policy) == verdict.judge(views, policy)


@given(diverged(), st.data(), policies)
def test_a_group_with_any_cleanly_exited_rank_is_stopped_never_sick(
        views: list[RankView], data: st.DataObject, policy: verdict.HealthPolicy) -> None:
    """However long the others have been stuck, dead or silent: a clean exit means the group is being stopped."""
    others = [RankStatus.REPORTING, RankStatus.DEAD, RankStatus.UNREACHABLE, RankStatus.ABSENT]
    picked = data.draw(st.lists(st.sampled_from(others), min_size=len(views), max_size=len(views)))
    views = [dataclasses.replace(v, status=s) for v, s in zip(views, picked, strict=True)]
    i = data.draw(st.integers(0, len(views) - 1))
    views[i] = RankView(rank=views[i].rank, status=RankStatus.EXITED, phase=P.EXITED)
    assert verdict.judge(views, policy).health is Health.STOPPED
