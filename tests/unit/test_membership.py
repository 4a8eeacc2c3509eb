"""The routers' membership keeps its grace timers per pool and per router, whatever order pools are polled in."""

from __future__ import annotations

import asyncio
from typing import Any

from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.cache import Observed
from pdfleet.operator.engines.membership import RouterMembership
from pdfleet.operator.planning.router.router_membership import Registered, Worker
from pdfleet.operator.render import labels
from tests.support.pools import example

Body = dict[str, Any]
SPEC = InferencePoolSpec.model_validate(example("local-fleet")["spec"])


def base(router: Body, port: int) -> str:
    return f"http://{router['status']['podIP']}:{port}"


class FakeRouters:
    """Routers' worker lists by base URL, as their `GET /workers` would answer (the worker API of
    `engines.engine_client.EngineClient`)."""

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
        self.lists[base(router, port)].append(Registered(f"id-{worker.url}", worker.url, str(worker.role)))
        return True


def observed(pool: str, router_ip: str, *engines: Body) -> Observed:
    router = {"metadata": {"name": f"{pool}-router-x", "uid": f"uid-{pool}"},
              "status": {"phase": "Running", "podIP": router_ip}}
    return Observed(pool={"metadata": {"name": pool, "namespace": "ns"}}, routers=(router,),
                    owned={("Pod", e["metadata"]["name"]): e for e in engines})


def engine_pod(group: str, role: str, ip: str) -> Body:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{group}-0", "labels": {labels.ROLE: role, labels.GROUP: group}},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}


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


def test_each_router_is_seen_short_of_a_worker_in_rotation_until_it_lists_it() -> None:
    """Without circuit breakers too: what a router lists is what the pool's status and a rollout's end read. A
    decode group just Ready is missing from the router until it finds it itself or the grace ends and the operator
    adds it."""
    lists: dict[str, list[Registered]] = {"http://127.1.4.1:30000": []}
    routers = FakeRouters(lists)
    now = [0.0]
    membership = RouterMembership(routers=routers, grace_s=5.0, clock=lambda: now[0],  # type: ignore[arg-type]
                                  key=lambda pod: f"key-of-http://{pod['status']['podIP']}:30000")
    seen = observed("a", "127.1.4.1", engine_pod("a-decode-0", "decode", "127.1.9.3"))
    url = f"http://127.1.9.3:{SPEC.decode.port}"
    asyncio.run(membership.sync(("ns", "a"), SPEC, seen, {}))
    [view] = membership.views(("ns", "a")).values()
    assert view.missing == (url,) and not view.settled and view.available == {"prefill": 0, "decode": 0}
    now[0] = 6.0
    asyncio.run(membership.sync(("ns", "a"), SPEC, seen, {}))
    [view] = membership.views(("ns", "a")).values()
    assert view.missing == () and view.available["decode"] == 1, "added after the grace, and seen at once"
