"""A verified configuration rollout under client load, through the whole local fleet: what clients feel of it.

A pool of 2 prefill + 2 decode groups (examples/local-fleet.yaml: each new group bakes 15 s, each new revision
is watched 20 s) serves a steady load through the real sglang-router (`pdfleet-sim load`'s client: `/generate`,
chat and streamed chat in turn, no retries). After a baseline window, `overlapSchedule` is switched (Disabled,
then Enabled again, ..., each a revision never verified before) and each rollout is followed until the pool's
status says it is verified: `RolloutVerified=True` (bake and watch passed) and `currentRevision` at the new
`updateRevision`, read every 100 ms. Then each bad revision kind (`--bad`) is rolled out the same way and
followed until the pool is verified again on the revision before. Reported:
- each good rollout's duration, from the spec patch to that status, against its floor: the steps it takes
  (one group at a time: maxUnavailable 1, or the example's maxSurge of 1, one group more per role) times the
  bake, plus the watch;
- client requests sent and failed during the good rollouts (the goal is zero failed), and the rate achieved;
- the p99 latency of client requests that completed during them, as a ratio of the p99 of those that completed
  in the baseline window before the first one (same process, same load, same pool);
- for each bad revision: the time from the patch to the pool verified on the previous revision again, and the
  client requests that failed meanwhile.
Needs the local cluster with the pod runner and the engine simulator (`make cluster-up`). About five minutes.

    python benchmarks/bench_rollout.py [--rollouts 2] [--concurrency 8] [--baseline 20] [--bad failing,slow]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import shutil
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import localfleet
from localfleet import Api, Body

from pdfleet.operator.api.scalars import parse_duration
from pdfleet.podrunner import loadgen

POOL = "rollout"
STATUS_PERIOD_S = 0.1


@dataclasses.dataclass
class Window:
    """What the load did between two moments: latency indices into the tally, counters at each end."""

    name: str
    seconds: float
    sent: int
    failed: int
    latencies_s: list[float]

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0

    def p99(self) -> float:
        lat = sorted(self.latencies_s)
        return lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")

    def line(self) -> str:
        return (f"{self.name}: {self.seconds:.1f} s, requests sent {self.sent} ({self.rate:.1f}/s), failed "
                f"{self.failed}, p99 {self.p99() * 1e3:.0f} ms over {len(self.latencies_s)} completed")


class Mark:
    """The load's counters at one moment."""

    def __init__(self, tally: loadgen.Tally) -> None:
        self.at = time.monotonic()
        self.sent, self.failed, self.completed = tally.sent, tally.failed, len(tally.latencies_s)

    def until(self, name: str, end: Mark, tally: loadgen.Tally) -> Window:
        return Window(name, end.at - self.at, end.sent - self.sent, end.failed - self.failed,
                      tally.latencies_s[self.completed:end.completed])


def verified(pool: Body, *, not_revision: str | None = None) -> bool:
    status = pool.get("status") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return conditions.get("RolloutVerified") == "True" and status.get("phase") == "Ready" and \
        bool(status.get("currentRevision")) and status.get("currentRevision") == status.get("updateRevision") and \
        status.get("observedGeneration") == pool["metadata"]["generation"] and \
        status.get("currentRevision") != not_revision


def router_key(api: Api, namespace: str, pod: Body) -> str:
    """The control-plane key the router pod started with, from its pool's Secret (the benchmark is an admin)."""
    ref = next(v["valueFrom"]["secretKeyRef"] for v in pod["spec"]["containers"][0]["env"]
               if v["name"] == "PDFLEET_ROUTER_ADMIN_KEY")
    secret = api.get(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def registered(url: str, key: str) -> int:
    """How many workers the router at `url` has (0 when it does not answer)."""
    request = urllib.request.Request(f"{url}/workers", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=3) as r:
            return len(json.loads(r.read()).get("workers", []))
    except (OSError, ValueError):
        return 0


def router_url(api: Api, namespace: str, port: int, workers: int, pool: str = POOL) -> str:
    """The router's URL once it has `workers` workers registered."""
    def found() -> str | None:
        pods = [p for p in api.pods(namespace, f"pdfleet.dev/pool={pool},app.kubernetes.io/component=router")
                if localfleet.is_ready(p)]
        if not pods:
            return None
        url = f"http://{pods[0]['status']['podIP']}:{port}"
        return url if registered(url, router_key(api, namespace, pods[0])) >= workers else None
    return localfleet.wait_for(f"the router with {workers} workers", found, timeout=180, interval=0.5)


# Bad revision kinds: the simulator's faults, in spec.engine.env as a person's change would put them.
BAD = {
    "failing": {"PDFLEET_SIM_FAULT": "failing", "PDFLEET_SIM_FAIL_SHARE": "0.3"},
    "slow": {"PDFLEET_SIM_FAULT": "slow-requests", "PDFLEET_SIM_LATENCY_FACTOR": "3"},
    "desync": {"PDFLEET_SIM_FAULT": "desync", "PDFLEET_SIM_FAULT_AFTER_S": "8"},
    "crash": {"PDFLEET_SIM_FAULT": "crash", "PDFLEET_SIM_FAULT_AFTER_S": "8"},
}


def rollout_once(api: Api, namespace: str, load: loadgen.Load, overlap: str, index: int) -> Window:
    before = api.pool(namespace, POOL)["status"]["currentRevision"]
    start = Mark(load.tally)
    # The env makes every rollout a revision never verified before, so each one bakes and is watched.
    localfleet.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p", json.dumps(
        {"spec": {"engine": {"overlapSchedule": overlap, "env": [{"name": "BENCH_ROLLOUT", "value": str(index)}]}}}))
    localfleet.wait_for(f"the rollout to overlapSchedule: {overlap} verified",
                        lambda: verified(api.pool(namespace, POOL), not_revision=before),
                        timeout=600, interval=STATUS_PERIOD_S)
    return start.until(f"rollout to overlapSchedule: {overlap}", Mark(load.tally), load.tally)


def bad_once(api: Api, namespace: str, load: loadgen.Load, kind: str) -> Window:
    """A bad revision rolled out, until the pool is verified on the revision before again."""
    pool = api.pool(namespace, POOL)
    before, engine = pool["status"]["currentRevision"], pool["spec"]["engine"]
    start = Mark(load.tally)
    env = [*(engine.get("env") or []), *({"name": k, "value": v} for k, v in BAD[kind].items())]
    localfleet.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p",
                       json.dumps({"spec": {"engine": {"env": env}}}))
    localfleet.wait_for(f"the bad revision ({kind}) rolled back", lambda: verified(
        now := api.pool(namespace, POOL)) and now["status"]["currentRevision"] == before and
        now["metadata"]["generation"] > pool["metadata"]["generation"] + 1, timeout=600, interval=STATUS_PERIOD_S)
    return start.until(f"bad revision {kind}, stopped and rolled back", Mark(load.tally), load.tally)


def measure(api: Api, namespace: str, *, rollouts: int, concurrency: int, baseline_s: float,
            bad: list[str]) -> tuple[Window, list[Window], list[Window], loadgen.Tally]:
    """The pool made, the load started, a baseline window, then `rollouts` rollouts under that load."""
    body = localfleet.pool_body(namespace, POOL)
    localfleet.apply(body)
    localfleet.wait_for("the pool Ready and verified", lambda: verified(api.pool(namespace, POOL)),
                        timeout=300, interval=0.5)
    url = router_url(api, namespace, api.pool(namespace, POOL)["spec"]["router"]["port"], workers=4)
    load = loadgen.Load(url, model=body["spec"]["model"]["servedName"], concurrency=concurrency, timeout_s=15)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(load.run()), daemon=True)
    thread.start()
    windows: list[Window] = []
    bads: list[Window] = []
    try:
        localfleet.wait_for("the load flowing", lambda: load.tally.ok >= 50, timeout=60)
        start = Mark(load.tally)
        time.sleep(baseline_s)  # a measuring window of fixed length, not a wait for a condition
        baseline = start.until("baseline before", Mark(load.tally), load.tally)
        print(baseline.line(), flush=True)
        for i in range(rollouts):
            windows.append(rollout_once(api, namespace, load, "Disabled" if i % 2 == 0 else "Enabled", i))
            print(windows[-1].line(), flush=True)
        for kind in bad:
            bads.append(bad_once(api, namespace, load, kind))
            print(bads[-1].line(), flush=True)
    finally:
        loop.call_soon_threadsafe(load.stop)
        thread.join(timeout=60)
    return baseline, windows, bads, load.tally


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=2, help="rollouts in turn: Disabled, Enabled, ...")
    parser.add_argument("--concurrency", type=int, default=8, help="client workers (8: about 45 requests/s)")
    parser.add_argument("--baseline", type=float, default=20, help="seconds of load measured before")
    parser.add_argument("--bad", default="failing,slow",
                        help=f"bad revision kinds rolled out after the good ones, of {', '.join(BAD)} ('' for none)")
    args = parser.parse_args()
    args.bad = [k for k in args.bad.split(",") if k]
    unknown = [k for k in args.bad if k not in BAD]
    if unknown:
        parser.error(f"--bad: unknown kind(s) {', '.join(unknown)}; known: {', '.join(BAD)}")
    return args


def main() -> None:
    args = options()
    kubeconfig = localfleet.cluster_up()
    localfleet.install_chart()
    namespace = f"bench-rollout-{uuid.uuid4().hex[:6]}"
    localfleet.kubectl("create", "namespace", namespace)
    api, tmp = Api(kubeconfig), Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    try:
        with localfleet.running_operator(localfleet.token_kubeconfig(kubeconfig, tmp / "kubeconfig"),
                                         tmp / "operator.log", namespace):
            baseline, windows, bads, tally = measure(api, namespace, rollouts=args.rollouts,
                                                     concurrency=args.concurrency, baseline_s=args.baseline,
                                                     bad=args.bad)
            print(f"loadavg after: {localfleet.loadavg()}")
    finally:
        localfleet.delete_namespace(api, namespace)
        api.close()
        (tmp / "kubeconfig").unlink(missing_ok=True)
    if tally.failed:
        print(f"the operator's log, kept: {tmp / 'operator.log'}; failures: {dict(tally.failures)}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)

    during = Window("all rollouts", sum(w.seconds for w in windows), sum(w.sent for w in windows),
                    sum(w.failed for w in windows), [x for w in windows for x in w.latencies_s])
    spec = localfleet.pool_body(namespace, POOL)["spec"]
    rollout = spec["rollout"]
    bake_s = parse_duration(rollout["verification"]["bake"]).total_seconds()
    surge = rollout.get("maxSurge") or {}
    # One group at a time (maxUnavailable 1, or a surge of 1): each role's groups in turn, one more with surge.
    steps = sum(spec[role]["replicas"] + (1 if surge.get(role) else 0) for role in ("prefill", "decode"))
    floor = steps * bake_s + parse_duration(rollout["postRolloutWatch"]).total_seconds()
    shape = ", ".join(f"{spec[role]['replicas']} {role}" for role in ("prefill", "decode"))
    print(f"rollout duration ({shape} groups, maxSurge {surge or 0}): "
          f"{', '.join(f'{w.seconds:.1f}' for w in windows)} s; the bake floor ({steps} steps x {bake_s:g} s bake + "
          f"the watch) is {floor:g} s: {', '.join(f'{w.seconds / floor:.2f}x' for w in windows)}")
    print(f"client requests during the rollouts: sent {during.sent} ({during.rate:.1f}/s), failed {during.failed}"
          f" (goal 0: {'PASS' if during.failed == 0 else 'FAIL'})")
    print(f"p99 latency during the rollouts / before: {during.p99() * 1e3:.0f} ms / {baseline.p99() * 1e3:.0f} ms"
          f" = {during.p99() / baseline.p99():.2f}x")
    for window in bads:
        print(f"{window.name}: {window.seconds:.1f} s from the patch to verified on the revision before; client "
              f"requests failed {window.failed} of {window.sent}")


if __name__ == "__main__":
    main()
