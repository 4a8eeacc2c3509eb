"""spec.autoscaling on the local fleet: how long a load step takes to become capacity, against the pod start alone.

A 1+1 pool (one engine per group, the engine simulator's decode step at 25 ms, so a 16-token answer runs about
0.4 s and a decode engine's running requests are about 0.4 x its rate) behind the real sglang-router.

- The floor, first, in the same run on the same pool and role: `spec.decode.replicas` edited from 1 to 2 by hand,
  timed to the pool's status showing 2 ready decode groups (what a new group takes alone: the pod created,
  started, probed Ready, the group seen Healthy and verified by the operator), then edited back.
- Then decode is autoscaled (1 to 2 groups on `runningPerEngine: 3`; the scale-up window, down window and interval
  below), and an open loop (`pdfleet-sim load`'s) steps from LOW to HIGH requests a second. Timed from the step:
  the decision (the autoscaler's write of `spec.decode.replicas`, read every 100 ms) and 2 ready decode groups.
  The step back down to LOW is timed to the decision and to 1 decode group left, and the client requests that
  failed from that step to the end are counted (the goal is 0: the group that goes is drained first).

Ratios to the floor are printed; nothing is asserted on wall-clock time (the machine is shared). Needs the local
cluster with the pod runner (`make cluster-up`). About three minutes with the defaults.

    python benchmarks/bench_autoscale.py [--repeats 2] [--low 3] [--high 12]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import localfleet
from bench_rollout import router_url
from localfleet import Api, Body

from pdfleet.podrunner import loadgen

POOL = "autoscaled"
PERIOD_S = 0.1
UP_WINDOW, DOWN_WINDOW, INTERVAL = 5, 20, 10
SIM_ENV = [{"name": "PDFLEET_SIM_DECODE_MS", "value": "25"}]
ONE_ENGINE = {"replicas": 1, "tp": 1, "gpusPerNode": 1}
# Rollout mechanics that add nothing to a new group's start: no bake, no watch, no surge (as the tests run).
ROLLOUT = {"autoRollback": False, "maxSurge": {"prefill": 0, "decode": 0}, "postRolloutWatch": "0s",
           "verification": {"bake": "0s"}}
AUTOSCALING = {"decode": {"minReplicas": 1, "maxReplicas": 2, "targets": {"runningPerEngine": 3},
                          "behavior": {"scaleUp": {"stabilizationWindowSeconds": UP_WINDOW},
                                       "scaleDown": {"stabilizationWindowSeconds": DOWN_WINDOW},
                                       "minIntervalSeconds": INTERVAL}}}


@dataclasses.dataclass
class Step:
    """One load step and what followed it, in seconds from the step."""

    decided_s: float
    done_s: float  # 2 ready decode groups after a step up; 1 decode group left after a step down


def decode(api: Api, namespace: str) -> tuple[int, int, int]:
    """The spec's decode replicas, the ready decode groups, and the decode groups that exist (terminating or
    not)."""
    pool = api.pool(namespace, POOL)
    ready = int(((pool.get("status") or {}).get("decode") or {}).get("ready", 0))
    pods = api.pods(namespace, f"pdfleet.dev/pool={POOL},pdfleet.dev/role=decode")
    return pool["spec"]["decode"]["replicas"], ready, len(pods)


def until(what: str, probe: Callable[[], bool], since: float, timeout: float = 300) -> float:
    localfleet.wait_for(what, probe, timeout=timeout, interval=PERIOD_S)
    return time.monotonic() - since


def floor_once(api: Api, namespace: str) -> float:
    """A plain replicas edit 1 -> 2: seconds to 2 ready decode groups; then back to 1, waited for."""
    start = time.monotonic()
    patch(namespace, {"decode": {"replicas": 2}})
    took = until("2 ready decode groups", lambda: decode(api, namespace)[1] == 2, start)
    patch(namespace, {"decode": {"replicas": 1}})
    until("1 decode group left", lambda: decode(api, namespace) == (1, 1, 1), time.monotonic())
    return took


def patch(namespace: str, spec: Body) -> None:
    localfleet.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": spec}))


def autoscaled_once(api: Api, namespace: str, url: str, model: str, low: float, high: float
                    ) -> tuple[Step, Step, loadgen.Phase, loadgen.Tally]:
    """LOW, then HIGH until 2 decode groups are ready, then LOW until 1 is left: both steps timed."""
    ends: list[float] = []
    # Phases longer than any wait below; the load is stopped once the pool is back at 1 group.
    load = loadgen.Load(url, model=model, timeout_s=30)
    steps = [loadgen.Step(low, 15), loadgen.Step(high, 90), loadgen.Step(low, 300)]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(load.run_steps(
        steps, report=lambda phase: ends.append(time.monotonic()))), daemon=True)
    thread.start()
    try:
        localfleet.wait_for("the step up", lambda: ends, timeout=60, interval=0.05)
        up_at = ends[0]
        decided = until("the scale-up decision", lambda: decode(api, namespace)[0] == 2, up_at)
        ready = until("2 ready decode groups", lambda: decode(api, namespace)[1] == 2, up_at)
        # The step down comes at the high phase's end: 90 s of HIGH, not shortened, so the open loop's schedule
        # stays what the load's phases report.
        localfleet.wait_for("the step down", lambda: len(ends) >= 2, timeout=120, interval=0.05)
        down_at = ends[1]
        down_decided = until("the scale-down decision", lambda: decode(api, namespace)[0] == 1, down_at)
        gone = until("1 decode group left", lambda: decode(api, namespace) == (1, 1, 1), down_at)
    finally:
        loop.call_soon_threadsafe(load.stop)
        thread.join(timeout=60)
    return Step(decided, ready), Step(down_decided, gone), load.phases[-1], load.tally


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="floor edits and load steps, each")
    parser.add_argument("--low", type=float, default=3, help="requests a second before and after the step")
    parser.add_argument("--high", type=float, default=12, help="requests a second in the step (about 4.8 "
                        "running on one decode engine against the target of 3)")
    return parser.parse_args()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    args = options()
    kubeconfig = localfleet.cluster_up()
    localfleet.install_chart()
    namespace = f"bench-autoscale-{uuid.uuid4().hex[:6]}"
    localfleet.kubectl("create", "namespace", namespace)
    api, tmp = Api(kubeconfig), Path(tempfile.mkdtemp(prefix="bench-autoscale-"))
    print(f"loadavg before: {localfleet.loadavg()}", flush=True)
    floors: list[float] = []
    ups: list[Step] = []
    downs: list[Step] = []
    failed = sent = after_sent = after_failed = 0
    try:
        with localfleet.running_operator(localfleet.token_kubeconfig(kubeconfig, tmp / "kubeconfig"),
                                         tmp / "operator.log", namespace):
            body = localfleet.pool_body(namespace, POOL, prefill=ONE_ENGINE, decode=ONE_ENGINE,
                                        engine={"env": SIM_ENV}, rollout=ROLLOUT)
            localfleet.apply(body)
            localfleet.wait_for("the pool Ready", lambda: (api.pool(namespace, POOL).get("status") or {}).get(
                "phase") == "Ready", timeout=300, interval=0.5)
            url = router_url(api, namespace, api.pool(namespace, POOL)["spec"]["router"]["port"], workers=2, pool=POOL)
            for i in range(args.repeats):
                floors.append(floor_once(api, namespace))
                print(f"floor {i + 1}: a replicas edit 1 -> 2 ready in {floors[-1]:.1f} s", flush=True)
            patch(namespace, {"autoscaling": AUTOSCALING})
            for i in range(args.repeats):
                up, down, last, tally = autoscaled_once(api, namespace, url, body["spec"]["model"]["servedName"],
                                                        args.low, args.high)
                ups.append(up)
                downs.append(down)
                sent, failed = sent + tally.sent, failed + tally.failed
                after_sent, after_failed = after_sent + last.tally.sent, after_failed + last.tally.failed
                print(f"step {i + 1}: {args.low:g} -> {args.high:g}/s decided in {up.decided_s:.1f} s, 2 ready in "
                      f"{up.done_s:.1f} s; {args.high:g} -> {args.low:g}/s decided in {down.decided_s:.1f} s, 1 "
                      f"left in {down.done_s:.1f} s; requests sent {tally.sent}, failed {tally.failed} "
                      f"({dict(tally.failures)})", flush=True)
            print(f"loadavg after: {localfleet.loadavg()}", flush=True)
    finally:
        localfleet.delete_namespace(api, namespace)
        api.close()
        (tmp / "kubeconfig").unlink(missing_ok=True)
    if failed:
        print(f"the operator's log, kept: {tmp / 'operator.log'}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    floor = median(floors)
    decided, ready = median([s.decided_s for s in ups]), median([s.done_s for s in ups])
    print(f"floor (a replicas edit to a ready group, median of {len(floors)}): {floor:.1f} s")
    print(f"load step -> scale decision: {decided:.1f} s (scale-up window {UP_WINDOW} s, polls every 1 s) = "
          f"{decided / floor:.2f}x the floor")
    print(f"load step -> new group Ready: {ready:.1f} s = {ready / floor:.2f}x the floor; decision -> Ready "
          f"{ready - decided:.1f} s = {(ready - decided) / floor:.2f}x")
    print(f"step down -> decision: {median([s.decided_s for s in downs]):.1f} s (down window {DOWN_WINDOW} s); "
          f"-> the group gone: {median([s.done_s for s in downs]):.1f} s")
    print(f"client requests failed: {failed} of {sent}; sent after the step down (the scale-down's): "
          f"{after_failed} of {after_sent} failed (goal 0: {'PASS' if failed == 0 else 'FAIL'})")


if __name__ == "__main__":
    main()
