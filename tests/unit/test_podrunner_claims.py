"""A pod's containers start only once no earlier pod's processes hold its IP or its directory."""

from __future__ import annotations

import asyncio

from pdfleet.podrunner.claims import Claims


async def test_a_successor_on_the_same_ip_waits_until_its_predecessor_lets_go() -> None:
    claims = Claims()
    order: list[str] = []
    old_holds, old_may_go = asyncio.Event(), asyncio.Event()

    async def predecessor() -> None:
        async with claims.held(["127.1.1.3", "/pods/ns/a"], "old"):
            old_holds.set()
            await old_may_go.wait()
            order.append("old processes gone")

    async def successor() -> None:
        await old_holds.wait()
        assert claims.others(["127.1.1.3", "/pods/ns/a"], "new") == {"127.1.1.3": "old", "/pods/ns/a": "old"}
        async with claims.held(["127.1.1.3", "/pods/ns/b"], "new"):
            order.append("new containers start")

    tasks = [asyncio.create_task(predecessor()), asyncio.create_task(successor())]
    await old_holds.wait()
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == []  # the successor is still waiting
    old_may_go.set()
    async with asyncio.timeout(5):
        await asyncio.gather(*tasks)
    assert order == ["old processes gone", "new containers start"]
    assert claims.others(["127.1.1.3", "/pods/ns/a", "/pods/ns/b"], "anyone") == {}


async def test_pods_on_other_ips_do_not_wait_for_each_other() -> None:
    claims = Claims()
    async with claims.held(["127.1.1.3"], "a"), asyncio.timeout(5), claims.held(["127.1.1.4"], "b"):
        assert claims.others(["127.1.1.3", "127.1.1.4"], "c") == {"127.1.1.3": "a", "127.1.1.4": "b"}
