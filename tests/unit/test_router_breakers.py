"""Which circuits the operator resets on a router, and what a router can route to
(planning/router/router_breakers.py)."""

from __future__ import annotations

from pdfleet.operator.api.roles import Role
from pdfleet.operator.planning.router import router_breakers
from pdfleet.operator.planning.router.router_membership import Registered, Worker

P1, P2, D1 = "http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000"
REGISTERED = [Registered("a", P1, "prefill"), Registered("b", P2, "prefill"), Registered("c", D1, "decode")]
WANTED = {P1: Worker(P1, Role.PREFILL, 8998, "p-prefill-0"), P2: Worker(P2, Role.PREFILL, 8998, "p-prefill-1"),
          D1: Worker(D1, Role.DECODE, None, "p-decode-0")}


def test_a_router_whose_prefill_circuits_are_all_open_lacks_prefill() -> None:
    view = router_breakers.view("r", REGISTERED, {P1: 1, P2: 1, D1: 0})
    assert view.available == {"prefill": 0, "decode": 1}
    assert view.lacking == ("prefill",) and view.open_circuits == (P1, P2)


def test_half_open_circuits_and_workers_missing_from_the_metrics_count_as_available() -> None:
    assert router_breakers.view("r", REGISTERED, {P1: 2}).available == {"prefill": 2, "decode": 1}


def test_a_worker_unhealthy_in_the_routers_own_checks_is_not_available() -> None:
    registered = [Registered("a", P1, "prefill", healthy=False), *REGISTERED[1:]]
    assert router_breakers.view("r", registered, {}).available == {"prefill": 1, "decode": 1}


def test_when_a_role_has_no_available_worker_every_open_healthy_worker_of_it_is_reset() -> None:
    view = router_breakers.view("r", REGISTERED, {P1: 1, P2: 1})
    resets = router_breakers.resets(view, REGISTERED, WANTED, fault=None)
    assert [(r.worker.url, r.cause) for r in resets] == [(P1, router_breakers.NO_WORKER),
                                                          (P2, router_breakers.NO_WORKER)]
    assert all("no other prefill worker" in r.reason for r in resets)


def test_an_open_circuit_nothing_explains_is_left_to_the_router_while_the_role_has_others() -> None:
    view = router_breakers.view("r", REGISTERED, {P1: 1})
    assert router_breakers.resets(view, REGISTERED, WANTED, fault=None) == ()


def test_a_fault_in_the_pool_explains_open_circuits_of_healthy_workers() -> None:
    view = router_breakers.view("r", REGISTERED, {P1: 1})
    resets = router_breakers.resets(view, REGISTERED, WANTED, fault="an engine group in Hang")
    assert [(r.worker.url, r.cause, r.reason) for r in resets] == [
        (P1, router_breakers.POOL_FAULT, "opened by failures that followed an engine group in Hang")]


def test_a_worker_out_of_rotation_is_never_reset() -> None:
    view = router_breakers.view("r", REGISTERED, {P1: 1, P2: 1})
    wanted = {P2: WANTED[P2], D1: WANTED[D1]}  # P1 is sick, or being replaced
    assert [r.worker.url for r in router_breakers.resets(view, REGISTERED, wanted, fault="x")] == [P2]


def _no_worker_resets() -> tuple[router_breakers.RouterView, tuple[router_breakers.Reset, ...]]:
    view = router_breakers.view("r", REGISTERED, {P1: 1, P2: 1})
    return view, router_breakers.resets(view, REGISTERED, WANTED, fault=None)


def test_a_circuit_that_opens_again_after_each_reset_is_reset_ever_more_rarely() -> None:
    """A worker that fails every request while the operator's checks pass: reset at once, then after 5 s, 10 s,
    20 s, 40 s, and a minute from then on, not at every poll."""
    view, wanted = _no_worker_resets()
    tried: dict[str, router_breakers.Tried] = {}
    resets_at = []
    for second in range(0, 400):  # a poll a second, the circuits open again at each
        done = router_breakers.due(wanted, tried, float(second))
        if done:
            resets_at.append(second)
        tried = router_breakers.remember(tried, view, done, float(second))
    assert resets_at == [0, 5, 15, 35, 75, 135, 195, 255, 315, 375]


def test_a_worker_whose_circuit_stays_closed_a_minute_after_its_reset_starts_over() -> None:
    view, wanted = _no_worker_resets()
    tried = router_breakers.remember({}, view, wanted, 0.0)
    tried = router_breakers.remember(tried, view, wanted, 5.0)  # two in a row: the next waits 10 s
    assert router_breakers.due(wanted, tried, 14.0) == ()
    closed = router_breakers.view("r", REGISTERED, {})
    assert router_breakers.remember(tried, closed, (), 30.0) == tried, "closed, but not for a minute yet"
    assert router_breakers.remember(tried, closed, (), 65.0) == {}
    assert router_breakers.remember(tried, view, (), 65.0) == tried, "open: the backoff holds"


def test_a_reset_the_router_refused_is_not_counted() -> None:
    view, wanted = _no_worker_resets()
    tried = router_breakers.remember({}, view, wanted[:1], 0.0)
    assert [r.worker.url for r in router_breakers.due(wanted, tried, 1.0)] == [P2]
