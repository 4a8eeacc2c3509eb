"""Probe requests for a baking group whose traffic is too thin to judge it.

A bake judges what the group served, from its engines' own counters; a pool with little traffic would leave a
group of a new revision waiting for requests that do not come. So while a baking group has served fewer than
`analysis.minRequests`, the operator sends it plain chat requests itself, the way the router pairs them in PD
(`toolcall_canary.run_pd`, plain probes): a decode group paired with a Ready prefill leader, a prefill group with
a Ready decode leader. The answers are not judged here: they land in the engines' counters like any request,
and the bake reads those. One run per group at a time, bounded in requests and time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from pdfleet.operator.cache import PoolKey
from pdfleet.operator.engines import canary_requests
from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.planning.router import router_membership

log = logging.getLogger(__name__)

PROBES_PER_RUN = 8
CONCURRENCY = 4
REQUEST_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 60.0
MAX_TOKENS = 16


@dataclasses.dataclass(frozen=True)
class Pair:
    """Where one run of probes goes: a prefill engine and a decode engine, one of them the baking group's."""

    group: str
    prefill_ip: str
    prefill_port: int
    bootstrap_port: int
    decode_ip: str
    decode_port: int
    model: str


async def probe(engines: EngineClient, pair: Pair, requests: int) -> None:
    """Sends `requests` plain probes through `pair`; failures are the engines' to count, not ours to judge."""
    try:
        await asyncio.wait_for(canary_requests.run_pd(
            engines, router_membership.worker_url(pair.prefill_ip, pair.prefill_port),
            router_membership.worker_url(pair.decode_ip, pair.decode_port),
            bootstrap_host=pair.prefill_ip, bootstrap_port=pair.bootstrap_port, model=pair.model,
            requests=requests, concurrency=min(CONCURRENCY, requests), timeout_s=REQUEST_TIMEOUT_S, parser=None,
            max_tokens=MAX_TOKENS, plain=True), RUN_TIMEOUT_S)
    except (canary_requests.Unreachable, TimeoutError) as e:
        log.info("bake probes for group %s: %s", pair.group, e)


class BakeProber:
    """The probe runs of every pool, one per baking group at a time. Create it inside the operator's event loop;
    `run` sends one (`probe` with the operator's client, or a test's own)."""

    def __init__(self, *, run: Callable[[Pair, int], Awaitable[None]]) -> None:
        self._run = run
        self._tasks: dict[tuple[PoolKey, str], asyncio.Task[None]] = {}
        self.sent = 0  # probes asked for, all told

    def ensure(self, key: PoolKey, pair: Pair, needed: int) -> None:
        """Starts a run of up to PROBES_PER_RUN probes for `pair.group`, unless one is under way."""
        slot = (key, pair.group)
        task = self._tasks.get(slot)
        if task is not None and not task.done():
            return
        requests = max(1, min(needed, PROBES_PER_RUN))
        self.sent += requests
        self._tasks[slot] = asyncio.create_task(self._guarded(pair, requests), name=f"bake-probes {pair.group}")

    async def _guarded(self, pair: Pair, requests: int) -> None:
        try:
            await self._run(pair, requests)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in one run must not end the others, nor the monitor
            log.exception("bake probes for group %s failed", pair.group)

    async def idle(self) -> None:
        """Returns once every run under way now has ended."""
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def forget(self, key: PoolKey) -> None:
        for slot in [s for s in self._tasks if s[0] == key]:
            self._tasks.pop(slot).cancel()

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
