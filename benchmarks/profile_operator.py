"""Where the operator's CPU goes, in process and without a cluster (docs/operator-throughput.md): a reconcile's plan
of a pool of 8 engine groups (its first, and at steady state), 100 settled pools planned in turn as a resync plans
them, and kopf's handling of the watch events one new pool of 8 groups causes (its objects created, its pods
scheduled, running and Ready, its router available, two status writes), fed through kopf's own
`process_resource_event` with pdfleet's handlers registered.

CPU seconds (process time, best of a few rounds), so that a loaded machine moves the figures less than wall time
would; `--profile` adds cProfile's top functions for each part. A tool for finding where time goes, not a benchmark
with goals (that is bench_operator.py, against the local cluster).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import cProfile
import json
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kopf  # noqa: E402
from kopf._cogs.structs import references  # noqa: E402
from kopf._core.actions import lifecycles  # noqa: E402
from kopf._core.engines import indexing  # noqa: E402
from kopf._core.reactor import inventory, processing  # noqa: E402

from pdfleet.operator import handlers  # noqa: E402
from pdfleet.operator.cache import Cache, Observed  # noqa: E402
from pdfleet.operator.planning import reconcile  # noqa: E402
from pdfleet.operator.planning.renders import Renders  # noqa: E402
from pdfleet.operator.runtime_state import OperatorState, Options  # noqa: E402
from tests.support.pools import pool_body  # noqa: E402
from tests.unit.test_planning import NOW, FakeCluster  # noqa: E402

Body = dict[str, Any]
GROUPS = 4  # per role: 8 engine groups a pool, as in bench_operator.py


def cpu(run: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


def profiled(run: Callable[[], object], top: int) -> None:
    profile = cProfile.Profile()
    profile.enable()
    run()
    profile.disable()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(top)


def settled(name: str) -> tuple[Body, Observed, Any, Any]:
    cluster = FakeCluster(pool_body(name=name, uid=f"uid-{name}", prefill=GROUPS, decode=GROUPS))
    cluster.converge()
    health, engines = cluster.answers()
    return cluster.pool, cluster.observed(), health, engines


def plans(args: argparse.Namespace) -> None:
    pool = pool_body(prefill=GROUPS, decode=GROUPS)
    empty = Observed(pool=pool, owned={})
    first = cpu(lambda: reconcile.plan(pool, empty, now=NOW, renders=Renders()), args.rounds * 10) * 1000
    one = [settled("p0")]
    many = [settled(f"p{n}") for n in range(100)]
    renders = Renders()

    def each(pools: list[tuple[Body, Observed, Any, Any]]) -> None:
        for pool_, observed, health, engines in pools:
            assert reconcile.plan(pool_, observed, now=NOW, health=health, engines=engines, renders=renders).empty

    each(one)
    each(many)
    steady = cpu(lambda: [each(one) for _ in range(100)], args.rounds) * 10
    turn = cpu(lambda: each(many), args.rounds) * 10
    print(f"plan of a pool of {2 * GROUPS} groups: first (nothing owned, a fresh render) {first:.2f} ms; steady "
          f"{steady:.2f} ms; steady, 100 pools in turn {turn:.2f} ms (CPU, best of {args.rounds})")
    if args.profile:
        profiled(lambda: each(many), args.top)


def resource(group: str, version: str, plural: str, kind: str) -> references.Resource:
    return references.Resource(group=group, version=version, plural=plural, kind=kind, namespaced=True,
                               verbs=frozenset({"list", "watch", "patch"}))


RESOURCES = {kind: resource(*rest, kind) for *rest, kind in handlers.OWNED_KINDS} | {
    "InferencePool": resource("pdfleet.dev", "v1alpha1", "inferencepools", "InferencePool")}
WRITERS = ("pdfleet", "kube-scheduler", "kubelet")  # each leaves a managedFields entry, as on the cluster


def pool_events(n: int, counter: list[int]) -> list[tuple[str, Body]]:
    """The watch events of one new pool's life to Ready, as the local cluster sends them."""
    pool = pool_body(name=f"p{n}", uid=f"uid-{n}", prefill=GROUPS, decode=GROUPS)
    plan = reconcile.plan(pool, Observed(pool=pool, owned={}), now=NOW)
    assert plan.status is not None
    out: list[tuple[str, Body]] = []

    def event(type_: str, kind: str, obj: Body) -> None:
        counter[0] += 1
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        obj["kind"] = kind
        meta.update(resourceVersion=str(counter[0]), creationTimestamp="2026-12-05T00:00:00Z")
        meta.setdefault("uid", f"uid-{kind}-{meta['name']}")
        meta["managedFields"] = [{"manager": m, "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {
            "f:metadata": {"f:labels": {f"f:{k}": {} for k in meta.get("labels", {})}}}} for m in WRITERS]
        out.append((kind, {"type": type_, "object": json.loads(json.dumps(obj))}))  # parsed afresh, as kopf does

    event("ADDED", "InferencePool", pool)
    for obj in sorted(plan.apply, key=lambda o: o["kind"] == "Pod"):
        event("ADDED", obj["kind"], obj)
    event("MODIFIED", "InferencePool", {**pool, "status": dict(plan.status)})
    for obj in (o for o in plan.apply if o["kind"] == "Pod"):
        pod = copy.deepcopy(obj)
        pod["spec"]["nodeName"] = "pdfleet-gpu-0"
        pod["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
        event("MODIFIED", "Pod", pod)
        pod["status"] = {"phase": "Running", "podIP": "127.1.0.2", "conditions": [{"type": "Ready", "status": "False"}],
                         "containerStatuses": [{"name": "engine", "ready": False, "restartCount": 0, "started": True,
                                                "state": {"running": {"startedAt": "2026-12-05T00:00:00Z"}}}]}
        event("MODIFIED", "Pod", pod)
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        event("MODIFIED", "Pod", pod)
    for obj in (o for o in plan.apply if o["kind"] == "Deployment"):
        event("MODIFIED", "Deployment", {**obj, "status": {"replicas": 1}})
        event("MODIFIED", "Deployment", {**obj, "status": {"replicas": 1, "availableReplicas": 1}})
    event("MODIFIED", "InferencePool", {**pool, "status": {**plan.status, "phase": "Ready"}})
    return out


def events(args: argparse.Namespace) -> None:
    registry = kopf.get_default_registry()
    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = handlers.NoDiffBase()  # as handlers.startup sets them
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="pdfleet.dev")
    counter = [100]
    pools = 30
    stream = [e for n in range(pools) for e in pool_events(n, counter)]

    def run() -> None:
        indexers = indexing.OperatorIndexers()
        indexers.ensure(registry._indexing.get_all_handlers())
        memories = inventory.ResourceMemories()
        state = OperatorState(options=Options())
        found = indexers.indices
        state.cache = Cache(pools=found["pool_index"], owned=[found[f"owned_{p}"] for _, _, p, _ in
                                                               handlers.OWNED_KINDS], routers=found["router_pods"])
        memo = kopf.Memo(state=state)

        async def feed() -> None:
            posted: asyncio.Queue[Any] = asyncio.Queue()
            for kind, raw in stream:
                await processing.process_resource_event(
                    lifecycle=lifecycles.all_at_once, indexers=indexers, registry=registry, settings=settings,
                    memories=memories, memobase=memo, resource=RESOURCES[kind], raw_event=raw,  # type: ignore[arg-type]
                    event_queue=posted, no_throttling=True)
            state.queue.close()

        asyncio.run(feed())

    spent = cpu(run, args.rounds)
    print(f"kopf's handling of a new pool's watch events: {len(stream) // pools} events per pool, "
          f"{1e6 * spent / len(stream):.0f} us per event, {1000 * spent / pools:.1f} ms per pool (CPU, best of "
          f"{args.rounds})")
    if args.profile:
        profiled(run, args.top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions of each part")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    plans(args)
    events(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
