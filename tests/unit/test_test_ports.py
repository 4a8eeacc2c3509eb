"""The tests' own port picker: workers never share a port, and one worker never hands out a port twice in a row
of calls made before any is bound (an engine asks for three at once)."""

from __future__ import annotations

from tests.support import ports


def test_the_workers_shares_are_disjoint_and_cover_the_pool() -> None:
    pool = range(27000, 27100)
    shares = [ports.worker_slice(pool, {"PYTEST_XDIST_WORKER": f"gw{i}", "PYTEST_XDIST_WORKER_COUNT": "3"})
              for i in range(3)]
    assert sorted(p for share in shares for p in share) == list(pool)
    assert not set(shares[0]) & set(shares[1]) and not set(shares[1]) & set(shares[2])


def test_outside_xdist_the_one_worker_gets_the_whole_pool() -> None:
    assert ports.worker_slice(range(10), {}) == list(range(10))


def test_ports_asked_for_before_any_is_bound_are_all_different() -> None:
    picked = [ports.free_port() for _ in range(300)]
    assert len(set(picked)) == len(picked)
