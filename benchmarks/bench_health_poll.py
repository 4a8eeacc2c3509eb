"""The operator's CPU for one rank-health poll of a pool of 100 engine groups, against one group.

What is measured is the operator's own polling path, unmodified: `HealthMonitor.poll` over a real `Cache`
(built from plain mappings, as kopf's indices are) holding a pool rendered by the operator's renderer, asking
every group's agent through the operator's real `EngineClient` at the pods' IPs and judging each group with
`planning.health.rank_health`. Every group (TP 2, one pod) is a real runtime `Agent` on its own loopback address
(127.2.x.y, port `AGENT_PORT`, as a pod IP would be) serving a real ledger that two ranks write through
`attach_rank`. The agents and their ranks live in child processes, so this process's CPU time is the
operator's side alone.

Baseline, in the same run: the same poll of a pool of one group. The two are interleaved round by round, so
load from elsewhere on the machine lands on both alike. Reported: CPU ms per poll (process time, median of
rounds), per group, the ratio to 100x the one-group cost, and the wall time of one poll (p50, p99).
Needs no cluster. Runs in about a minute.

    python benchmarks/bench_health_poll.py [--groups 100] [--rounds 30] [--polls 5] [--procs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import multiprocessing.connection
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from pdfleet.operator.api import checks
from pdfleet.operator.cache import Cache, PoolKey
from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.engines.monitor import HealthMonitor
from pdfleet.operator.render.context import RenderContext
from pdfleet.operator.render.desired import desired
from pdfleet.operator.render.engine_group import AGENT_PORT
from pdfleet.runtime.health import phases
from pdfleet.runtime.health.agent import Agent
from pdfleet.runtime.health.attach import attach_rank

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "bench"
TP = 2
STEP_PERIOD_S = 0.02  # each rank makes 50 steps a second: progress is all the verdict needs
RANK_STEP = (phases.Phase.RECV_BROADCAST, phases.Phase.LOCAL, phases.Phase.KV_POLL_ALL_REDUCE)

Body = dict[str, Any]


def address(i: int) -> str:
    return f"127.2.{i // 250}.{i % 250 + 1}"


def serve_agents(indices: list[int], shm: str, ready: multiprocessing.connection.Connection) -> None:
    """A child: one agent per group index, and one thread stepping all of their ranks."""
    agents = []
    writers = []
    for i in indices:
        path = Path(shm) / f"ledger-{i}"
        # No stack signal: many ranks share this process, and they would share one signal handler.
        ranks = [attach_rank(slot=r, rank=r, slots=TP, path=path, stack_signal=None) for r in range(TP)]
        for w in ranks:
            w.set_loop(phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE)
        writers += ranks
        agents.append(Agent(path, host=address(i), port=AGENT_PORT).start())

    def step_forever() -> None:
        while True:
            for w in writers:
                w.collective(RANK_STEP[0])
                w.begin(RANK_STEP[1])
                w.collective(RANK_STEP[2])
                w.begin(phases.Phase.FORWARD)
                w.step()
            time.sleep(STEP_PERIOD_S)

    threading.Thread(target=step_forever, daemon=True).start()
    ready.send(len(agents))
    threading.Event().wait()


def pool_objects(name: str, groups: int, uid: str) -> tuple[Body, list[Body]]:
    """A pool of `groups` TP-2 groups (at least one per role) as the apiserver would hold it, and its pods,
    Ready at their IPs."""
    body = yaml.safe_load((ROOT / "examples" / "local-fleet.yaml").read_text())
    body["metadata"] = {"name": name, "namespace": NAMESPACE, "uid": uid, "generation": 1, "resourceVersion": "1"}
    body["spec"]["prefill"]["replicas"] = max(1, groups // 2)
    body["spec"]["decode"]["replicas"] = max(1, groups - groups // 2)
    spec, problems = checks.validate_spec(body["spec"])
    if spec is None or problems:
        raise SystemExit(f"the bench pool does not validate: {problems}")
    pods = []
    for n, group in enumerate(desired(RenderContext.of(body), spec).groups):
        for pod in group.pods:
            pod = {**pod, "metadata": {**pod["metadata"], "uid": f"{uid}-{n}"}}
            pod["status"] = {"phase": "Running", "podIP": address(n),
                             "conditions": [{"type": "Ready", "status": "True"}]}
            pods.append(pod)
    if len(pods) != max(2, groups):
        raise SystemExit(f"expected one pod per group, rendered {len(pods)} for {groups} groups")
    return body, pods


async def poll_once(monitor: HealthMonitor, key: PoolKey) -> tuple[float, float]:
    """CPU seconds and wall seconds of one poll."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await monitor.poll(key)
    return time.process_time() - cpu0, time.perf_counter() - wall0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(groups: int, rounds: int, polls: int) -> None:
    big_key, one_key = (NAMESPACE, "fleet"), (NAMESPACE, "single")
    big_pool, big_pods = pool_objects("fleet", groups, "uid-fleet")
    # A PD pool has at least one group per role, so the one-group baseline is the same pool of which the
    # cache holds only the first pod (as while the others are created): the poll asks and judges one group.
    one_pool, one_pods = pool_objects("single", groups, "uid-single")
    one_pods = one_pods[:1]  # its IP is group 0's agent
    cache = Cache({big_key: [big_pool], one_key: [one_pool]}, [{big_key: big_pods, one_key: one_pods}])
    engines = EngineClient()
    monitor = HealthMonitor(cache=cache, engines=engines, poke=lambda _key: None)
    try:
        # Warm up until every group is judged Healthy, so what follows is the steady state being measured.
        deadline = time.monotonic() + 30
        while True:
            await monitor.poll(big_key)
            await monitor.poll(one_key)
            verdicts = collections.Counter(str(h.verdict) for h in monitor.health(big_key).values())
            alone = [str(h.verdict) for h in monitor.health(one_key).values()]
            if (verdicts.get("Healthy") == groups and alone == ["Healthy"]) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        print(f"verdicts before measuring: {groups} groups {dict(verdicts)}, the one group {alone}")
        cpu: dict[PoolKey, list[float]] = {big_key: [], one_key: []}
        wall: dict[PoolKey, list[float]] = {big_key: [], one_key: []}
        for _ in range(rounds):
            for key in (one_key, big_key):
                samples = [await poll_once(monitor, key) for _ in range(polls)]
                cpu[key].append(sum(c for c, _ in samples) / polls)
                wall[key] += [w for _, w in samples]
        verdicts = collections.Counter(str(h.verdict) for h in monitor.health(big_key).values())
        print(f"verdicts after measuring: {dict(verdicts)}")
    finally:
        await monitor.close()
        await engines.close()

    one_ms = statistics.median(cpu[one_key]) * 1e3
    big_ms = statistics.median(cpu[big_key]) * 1e3
    for label, key, n in (("1 group (baseline)", one_key, 1), (f"{groups} groups", big_key, groups)):
        ms = statistics.median(cpu[key]) * 1e3
        print(f"{label}: CPU {ms:.2f} ms/poll ({ms / n:.3f} ms/group; rounds min {min(cpu[key]) * 1e3:.2f}, "
              f"max {max(cpu[key]) * 1e3:.2f}); wall p50 {percentile(wall[key], 0.5) * 1e3:.1f} ms, "
              f"p99 {percentile(wall[key], 0.99) * 1e3:.1f} ms")
    print(f"CPU per poll per 100 groups: {big_ms * 100 / groups:.2f} ms; per group {big_ms / groups:.3f} ms; "
          f"ratio to {groups}x the 1-group poll: {big_ms / (groups * one_ms):.2f}")
    period = 1.0  # the example pools' heartbeatPeriod
    print(f"at one poll per {period:.0f} s, {groups} groups cost {big_ms / period / 10:.1f}% of one core")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--polls", type=int, default=5, help="polls per pool per round")
    parser.add_argument("--procs", type=int, default=2, help="child processes serving the agents")
    args = parser.parse_args()

    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of this process's state
    with tempfile.TemporaryDirectory(dir=shm, prefix="pdfleet-bench-") as tmp:
        children = []
        try:
            for p in range(args.procs):
                parent_end, child_end = ctx.Pipe(duplex=False)
                indices = list(range(p, args.groups, args.procs))
                child = ctx.Process(target=serve_agents, args=(indices, tmp, child_end), daemon=True)
                child.start()
                children.append((child, parent_end))
            for child, conn in children:
                if not conn.poll(60):
                    raise SystemExit(f"agent process {child.pid} did not start in 60 s")
                conn.recv()
            print(f"{args.groups} agents (TP {TP}, {TP * args.groups} ranks stepping every "
                  f"{STEP_PERIOD_S * 1e3:.0f} ms) in {args.procs} child process(es); loadavg "
                  f"{Path('/proc/loadavg').read_text().split()[:3]}")
            asyncio.run(measure(args.groups, args.rounds, args.polls))
        finally:
            for child, _ in children:
                child.terminate()
                child.join(5)


if __name__ == "__main__":
    main()
