"""The routers' membership keeps its grace timers per pool and per router, whatever order pools are polled in."""

from __future__ import annotations

import asyncio
from typing import Any

from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.cache import Observed
from pdfleet.operator.engines.membership import RouterMembership
from pdfleet.operator.planning.router_membership import Registered, Worker
from tests.support.pools import example

Body = dict[str, Any]
SPEC = InferencePoolSpec.model_validate(example("local-fleet")["spec"])


def base(router: Body, port: int) -> str:
    return f"http://{router['status']['podIP']}:{port}"


class FakeRouters:
    """Routers' worker lists by base URL, as their `GET /workers` would answer (the worker API of
    `engines.client.EngineClient`)."""

    def __init__(self, lists: dict[str, list[Registered]]) -> None:
        self.lists = lists
        self.removed: list[str] = []

    async def workers(self, router: Body, port: int, key: str | None) -> list[Registered] | None:
        assert key == f"key-of-{base(router, port)}", "each router is called with the key of that router pod"
        return list(self.lists[base(router, port)])

    async def remove_worker(self, router: Body, port: int, key: str | None, worker: Registered) -> bool:
        assert key == f"key-of-{base(router, port)}"
        self.lists[base(router, port)] = [w for w in self.lists[base(router, port)] if w.id != worker.id]
        self.removed.append(worker.url)
        return True

    async def add_worker(self, router: Body, port: int, key: str | None, worker: Worker) -> bool:
        return True


def observed(pool: str, router_ip: str) -> Observed:
    router = {"metadata": {"name": f"{pool}-router-x", "uid": f"uid-{pool}"},
              "status": {"phase": "Running", "podIP": router_ip}}
    return Observed(pool={"metadata": {"name": pool, "namespace": "ns"}}, owned={}, routers=(router,))


def test_a_stale_worker_of_each_pool_goes_after_the_grace_while_pools_take_turns() -> None:
    stale = {"http://127.1.4.1:30000": [Registered("a", "http://127.1.9.1:30000", "decode")],
             "http://127.1.4.2:30000": [Registered("b", "http://127.1.9.2:30000", "decode")]}
    routers = FakeRouters(stale)
    now = [0.0]
    membership = RouterMembership(routers=routers, grace_s=5.0, clock=lambda: now[0],  # type: ignore[arg-type]
                                  key=lambda pod: f"key-of-http://{pod['status']['podIP']}:30000")

    async def polls() -> None:
        for _ in range(7):
            await membership.sync(("ns", "a"), SPEC, observed("a", "127.1.4.1"), {})
            await membership.sync(("ns", "b"), SPEC, observed("b", "127.1.4.2"), {})
            now[0] += 1.0

    asyncio.run(polls())
    assert sorted(routers.removed) == ["http://127.1.9.1:30000", "http://127.1.9.2:30000"]
