"""Runs the tool-call canary for the toolCallCanary gate: once per new decode leader pod (by uid), as a task of its
own, so a poll of the health monitor never waits for it; the finding is taken up by a later poll.

Each run is bounded: a few requests (`REQUESTS`, all at once), a short timeout per request and for the whole
run. Only the pods' own IPs (`status.podIP`) are contacted, without proxies. What a run means for the gate is
`planning.rollout.canary_gate` (pure); an inconclusive run (the engines did not answer) is retried after `RETRY_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from pdfleet.operator import metrics
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import GateState
from pdfleet.operator.cache import PoolKey
from pdfleet.operator.engines import canary_requests
from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.planning.rollout import canary_gate
from pdfleet.operator.planning.rollout.canary_gate import CanaryFinding
from pdfleet.operator.planning.router import router_membership

log = logging.getLogger(__name__)

REQUESTS = 8  # half with tools; all in flight together, so tool requests share batches with plain ones
REQUEST_TIMEOUT_S = 10.0
RUN_TIMEOUT_S = 30.0  # the whole run, the decode engine's model list included
MAX_TOKENS = 32
RETRY_S = 15.0  # after an inconclusive run


@dataclasses.dataclass(frozen=True)
class Target:
    """Where one canary run goes: the decode group's leader, paired with a prefill engine."""

    decode_uid: str
    decode_ip: str
    decode_port: int
    prefill_name: str
    prefill_ip: str
    prefill_port: int
    bootstrap_port: int
    model: str
    parser: str | None


def target(spec: InferencePoolSpec, decode_leader: dict[str, Any], prefill_leader: dict[str, Any]) -> Target | None:
    """The run at a decode group's leader paired with a prefill group's leader, None while either has no IP."""
    decode_ip, prefill_ip = router_membership.pod_ip(decode_leader), router_membership.pod_ip(prefill_leader)
    if decode_ip is None or prefill_ip is None:
        return None
    return Target(decode_uid=str(decode_leader["metadata"].get("uid")), decode_ip=decode_ip,
                  decode_port=spec.decode.port, prefill_name=prefill_leader["metadata"]["name"], prefill_ip=prefill_ip,
                  prefill_port=spec.prefill.port, bootstrap_port=spec.prefill.bootstrap_port,
                  model=spec.model.served_name, parser=spec.model.tool_call_parser)


async def run_once(engines: EngineClient, target: Target, *, requests: int = REQUESTS,
                   timeout_s: float = REQUEST_TIMEOUT_S, run_timeout_s: float = RUN_TIMEOUT_S) -> CanaryFinding:
    """One bounded canary run at `target`, as the gate reads it."""
    try:
        report = await asyncio.wait_for(canary_requests.run_pd(
            engines, router_membership.worker_url(target.prefill_ip, target.prefill_port),
            router_membership.worker_url(target.decode_ip, target.decode_port),
            bootstrap_host=target.prefill_ip, bootstrap_port=target.bootstrap_port, model=target.model,
            requests=requests, concurrency=requests, timeout_s=timeout_s, parser=target.parser,
            max_tokens=MAX_TOKENS), run_timeout_s)
    except canary_requests.Unreachable as e:
        return canary_gate.inconclusive(str(e))
    except TimeoutError:
        return canary_gate.inconclusive(f"the run took longer than {run_timeout_s:.0f} s")
    return canary_gate.finding(report, prefill=target.prefill_name)


class CanaryRunner:
    """The canary runs of every pool, and what they found, by decode leader pod uid. Create it inside the
    operator's event loop; `done` is called with the pool's key when a run finishes (to poll it again), `run` starts
    one (`run_once` with the operator's client, or a test's own)."""

    def __init__(self, *, done: Callable[[PoolKey], None], run: Callable[[Target], asyncio.Future[CanaryFinding]],
                 retry_s: float = RETRY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._done = done
        self._retry_s = retry_s
        self._run = run
        self._clock = clock
        self._tasks: dict[PoolKey, dict[str, asyncio.Future[CanaryFinding]]] = {}
        self._found: dict[PoolKey, dict[str, tuple[CanaryFinding, float]]] = {}  # with when it was found

    def ensure(self, key: PoolKey, target: Target) -> None:
        """Starts a run at `target` unless one is under way or has found something (an inconclusive finding is
        retried once `retry_s` passed)."""
        uid = target.decode_uid
        if uid in self._tasks.get(key, {}):
            return
        kept = self._found.get(key, {}).get(uid)
        if kept is not None and (kept[0].state is not GateState.WAITING or
                                 self._clock() - kept[1] < self._retry_s):
            return
        task = self._run(target)
        self._tasks.setdefault(key, {})[uid] = task
        task.add_done_callback(lambda t: self._finished(key, uid, t))

    def _finished(self, key: PoolKey, uid: str, task: asyncio.Future[CanaryFinding]) -> None:
        if self._tasks.get(key, {}).get(uid) is not task:
            return  # forgotten meanwhile
        del self._tasks[key][uid]
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:  # a bug, not a finding: said, and retried like an inconclusive run
            log.error("the tool-call canary at pod uid %s failed", uid, exc_info=error)
            found = canary_gate.inconclusive(f"{type(error).__name__}: {error}")
        else:
            found = task.result()
        log.info("tool-call canary of %s/%s at pod uid %s: %s %s", *key, uid, found.state, found.message,
                 extra={"namespace": key[0], "pool": key[1]})
        metrics.TOOLCALL_CANARY_RUNS.labels(result=str(found.state)).inc()
        self._found.setdefault(key, {})[uid] = (found, self._clock())
        self._done(key)

    def findings(self, key: PoolKey, alive: set[str]) -> Mapping[str, CanaryFinding]:
        """What was found at the pool's pods, by uid; pods not `alive` any more are forgotten (runs at them
        cancelled), so the memory stays as small as the fleet."""
        for uid, task in list(self._tasks.get(key, {}).items()):
            if uid not in alive:
                del self._tasks[key][uid]
                task.cancel()
        found = self._found.get(key, {})
        for uid in set(found) - alive:
            del found[uid]
        return {uid: f for uid, (f, _) in found.items()}

    def forget(self, key: PoolKey) -> None:
        for task in self._tasks.pop(key, {}).values():
            task.cancel()
        self._found.pop(key, None)

    async def close(self) -> None:
        tasks = [t for runs in self._tasks.values() for t in runs.values()]
        for key in list(self._tasks):
            self.forget(key)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
