"""What each router of a pool can route to, and which circuit breakers the operator resets. Pure.

sglang-router (0.3.2) counts a failed PD request against both workers of its pair. Requests held by a hung decode
engine fail together when it is restarted, and open the circuits of the healthy prefill engines they were paired
with: a router then answers `503 No available prefill workers` to everyone until the circuits time out, while
every engine is healthy. So, on a router that runs breakers (`spec.router.circuitBreaker.enabled`), the operator
resets the circuit of a worker it holds in rotation (Ready, rank health not sick) when

- no worker of that role is available on that router (every request would be refused: trying a worker the
  operator judges healthy cannot be worse), or
- the pool had a fault of its own (an engine group sick, restarted or being replaced) within the breaker's
  window: the failures that opened the circuit are explained by that fault, not by this worker.

A circuit opened by failures nothing in the pool explains, on a router that still has other workers of the role,
is left to the router: that is what breakers are for. A reset is a re-registration (the router's worker API has
no other way): remove, then add the same URL; the new registration starts with a closed circuit.

A worker whose circuit opens again right after its reset fails requests while the operator's checks pass (an
engine answering 500s, say): resetting it at every poll would hand it a trial request a second and post a Warning
each time. Its resets back off (`due`): the first at once, the next after 5 s, then doubling up to a minute; a
worker whose circuit is closed a minute after its last reset starts over.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from pdfleet.operator.planning.router.router_membership import Registered, Worker
from pdfleet.runtime import router_ready

ROLES = router_ready.ROLES
# Why a circuit is reset: the bounded values of pdfleet_router_circuit_resets_total{reason}.
NO_WORKER = "no available worker"
POOL_FAULT = "fault in the pool"
FIRST_BACKOFF_S = 5.0  # between a worker's first reset on a router and its second
MAX_BACKOFF_S = 60.0
QUIET_S = 60.0  # closed this long after its last reset, a worker's resets start over


@dataclasses.dataclass(frozen=True)
class RouterView:
    """What one router can route to now."""

    router: str  # pod name
    available: Mapping[str, int]  # role -> workers healthy in the router's own checks and not circuit-open
    open_circuits: tuple[str, ...] = ()  # URLs of workers whose circuit is open
    missing: tuple[str, ...] = ()  # URLs of workers the operator holds in rotation that the router does not list

    @property
    def lacking(self) -> tuple[str, ...]:
        """The roles it has no available worker of: it answers every request 503."""
        return tuple(role for role in ROLES if self.available.get(role, 0) < 1)

    @property
    def settled(self) -> bool:
        """It lists every worker in rotation and can reach a worker of each role: what a rollout waits for before
        it calls itself done (a rollback or restart that left a router short is not over)."""
        return not self.lacking and not self.missing


@dataclasses.dataclass(frozen=True)
class Reset:
    worker: Registered
    cause: str  # NO_WORKER or POOL_FAULT
    reason: str  # the same, said for the Event


def view(router: str, registered: Sequence[Registered], states: Mapping[str, int],
         wanted: Iterable[str] = ()) -> RouterView:
    """`states`: URL -> circuit state, from the router's metrics (a worker missing there has a closed circuit;
    empty for a router without breakers). Available means what the router's readiness sidecar counts
    (runtime/router_ready.py). `wanted`: the URLs of the workers the operator holds in rotation."""
    available = router_ready.available(
        [{"url": w.url, "worker_type": w.worker_type, "is_healthy": w.healthy} for w in registered], states)
    opened = sorted(w.url for w in registered if states.get(w.url, 0) == router_ready.OPEN)
    missing = sorted(set(wanted) - {w.url for w in registered})
    return RouterView(router, available, tuple(opened), tuple(missing))


def resets(router: RouterView, registered: Sequence[Registered], wanted: Mapping[str, Worker], *,
           fault: str | None) -> tuple[Reset, ...]:
    """The circuits to reset on `router`. `fault`: what went wrong in the pool within the breaker's window, if
    anything (it explains failures charged to the workers it was paired with)."""
    out = []
    for worker in registered:
        if worker.url not in router.open_circuits or worker.url not in wanted:
            continue
        if worker.worker_type in router.lacking:
            out.append(Reset(worker, NO_WORKER, f"no other {worker.worker_type} worker was available on the router"))
        elif fault is not None:
            out.append(Reset(worker, POOL_FAULT, f"opened by failures that followed {fault}"))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Tried:
    """A worker's resets on one router in a row (until its circuit is seen closed `QUIET_S` after the last)."""

    count: int
    at: float  # the last one's time (monotonic seconds)

    @property
    def next_at(self) -> float:
        return self.at + min(FIRST_BACKOFF_S * 2 ** (self.count - 1), MAX_BACKOFF_S)


def due(wanted: Sequence[Reset], tried: Mapping[str, Tried], now: float) -> tuple[Reset, ...]:
    """The resets of `wanted` whose worker is not backing off. `tried`: by worker URL, on this router."""
    return tuple(r for r in wanted if (t := tried.get(r.worker.url)) is None or now >= t.next_at)


def remember(tried: Mapping[str, Tried], router: RouterView, done: Sequence[Reset], now: float) -> dict[str, Tried]:
    """`tried` after the resets `done` at `now`: those counted, and a worker whose circuit is closed `QUIET_S` after
    its last reset forgotten (`router`: the view before the resets)."""
    out = {url: t for url, t in tried.items() if url in router.open_circuits or now - t.at < QUIET_S}
    for reset in done:
        before = out.get(reset.worker.url)
        out[reset.worker.url] = Tried((before.count if before else 0) + 1, now)
    return out
