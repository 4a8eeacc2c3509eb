"""Time from an injected desync to the Desync verdict in the pool's status, through the whole local fleet.

The chain measured: `kubectl annotate pod <decode pod> sim.pdfleet.dev/fault=desync` -> the apiserver -> the pod
runner rewrites the pod's downward-API annotations file -> the engine simulator's ranks diverge in the real
ledger -> the pod's agent -> the operator's rank-health poll (running as the chart's ServiceAccount) -> the
verdict in `status.groups[]`. Each group is then restarted by the operator (a generous budget, short backoff)
and its new pod is injected again later. The decode groups are injected in turn, so one group restarts while
the next is injected: detection is measured with restarts going on, as in a fleet.

The clock starts right after `kubectl annotate` returns (the write is committed then); the status is read
every 50 ms through one kept-alive HTTPS connection. Reported, over every injection: median and p99 (with
20 injections the p99 is the worst one) of
- injection -> Desync in status, against the goal p99 <= desyncAfter + heartbeatPeriod + 1 s (an injection
  whose Desync status never showed counts against the goal: it is listed with the verdicts that were seen);
- injection -> Desync or the group's restart counted in status, whichever came first;
- the baselines: injection -> the annotation read back from the apiserver, and -> the annotation in the
  pod's downward-API file written by the runner (what the engine can see at the earliest);
- injection -> the group's new pod Ready (seen within 200 ms).
Needs the local cluster with the pod runner and the engine simulator (`make cluster-up`). A few minutes.

    python benchmarks/bench_desync_detection.py [--injections 20] [--groups 4]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import localfleet
from localfleet import FAULT, Api, Body

POOL = "desync"
HEARTBEAT_S, DESYNC_AFTER_S = 1.0, 2.0
HEALTH = {"heartbeatPeriod": "1s", "desyncAfter": "2s", "hangAfter": "4s",
          # Every injection restarts its group: the budget must never run out within a run, and the
          # backoff must not hold a group back longer than the others take to come round.
          "restartBudget": {"count": 50, "window": "1h"}, "backoff": {"initial": "1s", "max": "2s"}}
STATUS_PERIOD_S = 0.05
SWEEP_EVERY = 4  # status reads per look at the restarting groups' pods: their Ready is known within 200 ms
FILE_PERIOD_S = 0.005


@dataclasses.dataclass
class Injection:
    group: str
    uid: str  # of the pod injected: its replacement's Ready ends the injection
    t0: float  # monotonic, right after `kubectl annotate` returned
    annotate_s: float  # how long `kubectl annotate` took; the clock starts after it
    readback_s: float | None = None
    delivered_s: float | None = None
    desync_s: float | None = None
    acted_s: float | None = None  # Desync, or the group's restart counted, whichever status showed first
    ready_s: float | None = None
    note: str = ""


def group_pod(api: Api, namespace: str, group: str) -> Body | None:
    pods = [p for p in api.pods(namespace, f"pdfleet.dev/group={group}") if not p["metadata"].get("deletionTimestamp")]
    return pods[0] if len(pods) == 1 else None


def healthy_pod(api: Api, namespace: str, group: str) -> Body | None:
    """The group's one pod once it is Ready, carries no fault and its group reads Healthy."""
    if localfleet.groups(api.pool(namespace, POOL)).get(group, {}).get("verdict") != "Healthy":
        return None
    pod = group_pod(api, namespace, group)
    if pod is None or not localfleet.is_ready(pod) or FAULT in (pod["metadata"].get("annotations") or {}):
        return None
    return pod


def delivered(annotations: Path) -> bool:
    with contextlib.suppress(OSError):
        return f'{FAULT}="desync"' in annotations.read_text()
    return False


def sweep(api: Api, namespace: str, shots: list[Injection]) -> bool:
    """Notes the new pod Ready of every injected group still waiting for one, with one read for all, so the
    groups restart while the next ones are injected. True when none is left waiting."""
    waiting = [s for s in shots if s.ready_s is None]
    if not waiting:
        return True
    now = time.monotonic()
    live: dict[str, list[Body]] = {}
    for pod in api.pods(namespace, localfleet.engine_selector(POOL)):
        if not pod["metadata"].get("deletionTimestamp"):
            live.setdefault(pod["metadata"]["labels"].get("pdfleet.dev/group", ""), []).append(pod)
    for shot in waiting:
        pods = live.get(shot.group, [])
        if len(pods) == 1 and pods[0]["metadata"]["uid"] != shot.uid and localfleet.is_ready(pods[0]):
            shot.ready_s = now - shot.t0
    return all(s.ready_s is not None for s in shots)


def inject_once(api: Api, namespace: str, group: str, pods_dir: Path, shots: list[Injection], *,
                timeout: float) -> Injection:
    def ready_to_inject() -> Body | None:
        sweep(api, namespace, shots)  # first, so a replacement is seen Ready no later than its group Healthy
        return healthy_pod(api, namespace, group)
    pod = localfleet.wait_for(f"{group} Healthy", ready_to_inject, timeout=180)
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    annotations = pods_dir / namespace / name / "podinfo" / "annotations"
    restarts = localfleet.groups(api.pool(namespace, POOL))[group].get("restarts", 0)

    before = time.monotonic()
    localfleet.kubectl("annotate", "pod", name, "-n", namespace, "--overwrite", f"{FAULT}=desync")
    t0 = time.monotonic()
    shot = Injection(group=group, uid=uid, t0=t0, annotate_s=t0 - before)
    while shot.readback_s is None and time.monotonic() < t0 + timeout:
        seen = api.pod(namespace, name)
        if seen is not None and (seen["metadata"].get("annotations") or {}).get(FAULT) == "desync":
            shot.readback_s = time.monotonic() - t0

    next_status = t0
    deadline = t0 + timeout
    reads = 0
    trail: list[str] = []  # the group's verdicts as they changed, to say what happened when no Desync came
    while shot.desync_s is None and time.monotonic() < deadline:
        now = time.monotonic()
        if shot.delivered_s is None and delivered(annotations):
            shot.delivered_s = now - t0
        if now >= next_status:
            next_status += STATUS_PERIOD_S
            reads += 1
            if reads % SWEEP_EVERY == 0:
                sweep(api, namespace, shots)
            g = localfleet.groups(api.pool(namespace, POOL)).get(group, {})
            if not trail or not trail[-1].startswith(f"{g.get('verdict')} "):
                trail.append(f"{g.get('verdict')} at {now - t0:.1f} s ({g.get('message', '')[:100]})")
            if g.get("verdict") == "Desync":
                shot.desync_s = shot.acted_s = time.monotonic() - t0
            elif g.get("restarts", 0) > restarts and g.get("restartCause") == "Desync":
                # Status says Desync as the cause of the restart it already made (the reconcile that restarted
                # the group wrote its status too): detected, timed no earlier than the restart.
                shot.desync_s = shot.acted_s = time.monotonic() - t0
                shot.note = "Desync seen as the restart's cause"
            elif g.get("restarts", 0) > restarts:
                # The operator acted on a verdict status never showed us: one reconcile both restarted the
                # group and wrote its status (Terminating reads Unknown), or Desync held for under 50 ms.
                shot.acted_s = time.monotonic() - t0
                shot.note = f"restarted without a Desync seen; verdicts: {said(trail)}"
                break
        time.sleep(FILE_PERIOD_S if shot.delivered_s is None else STATUS_PERIOD_S / 5)
    if shot.desync_s is None and not shot.note:
        shot.note = f"no Desync within {timeout:.0f} s; verdicts: {said(trail)}"
    return shot


def said(trail: list[str], most: int = 6) -> str:
    more = f"; ... {len(trail)} changes in all (status flapping?)" if len(trail) > most else ""
    return "; ".join(trail[:most]) + more


def summary(label: str, values: list[float | None]) -> str:
    got = sorted(v for v in values if v is not None)
    if not got:
        return f"{label}: none measured"
    p99 = got[min(len(got) - 1, round(0.99 * (len(got) - 1)))]
    missing = f", {len(values) - len(got)} missing" if len(got) < len(values) else ""
    return (f"{label}: median {statistics.median(got) * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms, "
            f"min {got[0] * 1e3:.0f} ms (n={len(got)}{missing})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--injections", type=int, default=20)
    parser.add_argument("--groups", type=int, default=4, help="decode groups at TP 2, injected in turn")
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for one Desync")
    args = parser.parse_args()

    kubeconfig = localfleet.cluster_up()
    pods_dir = kubeconfig.parent / "pods"  # the runner's pod directories (docs/local-fleet.md)
    localfleet.install_chart()
    namespace = f"pdfleet-bench-desync-{os.getpid()}"
    localfleet.kubectl("create", "namespace", namespace)
    api = Api(kubeconfig)
    shots: list[Injection] = []
    tmp = Path(tempfile.mkdtemp(prefix="pdfleet-bench-desync-"))
    try:
        with localfleet.running_operator(localfleet.token_kubeconfig(kubeconfig, tmp / "kubeconfig"),
                                         tmp / "operator.log", namespace) as _op:
            localfleet.apply(localfleet.pool_body(
                namespace, POOL, prefill={"replicas": 1, "tp": 1, "gpusPerNode": 1},
                decode={"replicas": args.groups, "tp": 2, "gpusPerNode": 2}, router={"replicas": 0},
                health=HEALTH))
            decode = [f"{POOL}-decode-{i}" for i in range(args.groups)]
            started = time.monotonic()
            for group in decode:
                localfleet.wait_for(f"{group} Healthy", lambda g=group: healthy_pod(api, namespace, g), timeout=300)
            print(f"pool of 1 prefill + {args.groups} decode groups (TP 2) Healthy in "
                  f"{time.monotonic() - started:.1f} s; loadavg {localfleet.loadavg()}")
            for i in range(args.injections):
                shot = inject_once(api, namespace, decode[i % len(decode)], pods_dir, shots, timeout=args.timeout)
                shots.append(shot)
                fmt = [f"{k} {v * 1e3:.0f} ms" for k, v in (("annotated", shot.readback_s),
                       ("delivered", shot.delivered_s), ("Desync", shot.desync_s)) if v is not None]
                print(f"  #{i + 1} {shot.group}: {', '.join(fmt)} {shot.note}".rstrip(), flush=True)
            with contextlib.suppress(SystemExit):
                localfleet.wait_for("the last groups' new pods Ready", lambda: sweep(api, namespace, shots),
                                    timeout=180, interval=0.1)
            print(f"loadavg after: {localfleet.loadavg()}")
    finally:
        localfleet.delete_namespace(api, namespace)
        api.close()
        (tmp / "kubeconfig").unlink(missing_ok=True)
    if all(s.desync_s is not None for s in shots):
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"the operator's log, kept for the injections without a Desync: {tmp / 'operator.log'}")

    goal = DESYNC_AFTER_S + HEARTBEAT_S + 1.0
    print(summary("kubectl annotate itself (before the clock starts)", [s.annotate_s for s in shots]))
    print(summary("baseline: injection -> annotation read back from the apiserver", [s.readback_s for s in shots]))
    print(summary("baseline: injection -> annotation in the pod's downward-API file",
                  [s.delivered_s for s in shots]))
    print(summary("injection -> Desync in the pool's status", [s.desync_s for s in shots]))
    print(summary("injection -> Desync or the group's restart in status", [s.acted_s for s in shots]))
    print(summary("injection -> the group's new pod Ready (seen within 200 ms)", [s.ready_s for s in shots]))
    detected = sorted(s.desync_s for s in shots if s.desync_s is not None)
    if detected:
        p99 = detected[min(len(detected) - 1, round(0.99 * (len(detected) - 1)))]
        verdict = "PASS" if p99 <= goal and len(detected) == len(shots) else "FAIL"
        print(f"goal p99 <= desyncAfter {DESYNC_AFTER_S:.0f} s + heartbeatPeriod {HEARTBEAT_S:.0f} s + 1 s = "
              f"{goal:.1f} s: {verdict} (p99 {p99:.2f} s = {p99 / goal:.2f}x the goal; "
              f"{len(detected)}/{len(shots)} injections detected)")
        delivered_med = statistics.median([s.delivered_s for s in shots if s.delivered_s is not None] or [0.0])
        print(f"median beyond the floor of desyncAfter after delivery: "
              f"{(statistics.median(detected) - delivered_med - DESYNC_AFTER_S) * 1e3:.0f} ms")
    else:
        print(f"goal p99 <= {goal:.1f} s: FAIL (no injection was detected)")


if __name__ == "__main__":
    main()
