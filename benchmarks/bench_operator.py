"""The operator under load: N InferencePools (default 100) of 8 engine groups each on kwok GPU nodes, against
a floor measured in the same run.

Two scenarios, each from a settled cluster (the previous scenario's namespace gone, with its pods):
- floor: the very objects the operator would write for each pool, rendered by its own planner before the
  clock starts, created by a client with no logic (operator_load.Floor), plus one status write per pool;
- operator: the real operator (`python -m pdfleet.operator`, 8 workers) watching a namespace of its own.
Pools are created back to back (burst) or `--rate` per second (paced). For each pool: seconds from creating
it to all of its engine pods existing (one pod watch; p50 and p99).

Reported, with PASS or FAIL per goal (a benchmark reports; it never fails a build):
- operator p99 / floor p99, the headline (goal in the burst: <= 1.3x);
- operator p99 (goal paced at 2 pools/s: < 2 s);
- API writes per pool, operator and floor; the operator's peak RSS (goal < 250 MB); its writes at steady
  state, all pods Ready and nothing changing (goal: 0).
Engine pods run no process: their namespace is labelled pdfleet.dev/simulate=false, which pdfleet-sim
honours (docs/local-fleet.md), so it marks them Ready and deletes them at once.

Needs the local cluster (`make cluster-up`); it adds GPU nodes as needed and removes them after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client as k8s
from localfleet import cluster_up, free_port, kubectl, running_operator
from operator_load import (
    PODS_PER_POOL,
    WORKERS,
    Floor,
    PodClock,
    create_pools,
    delete_namespace,
    namespace_body,
    percentile,
    rendered,
    settle,
)

from pdfleet.operator.kube.kube_client import KubeClient, load_configuration

ROOT = Path(__file__).resolve().parents[1]
RESYNC_S = 5
BURST_RATIO_GOAL = 1.3
PACED_P99_GOAL_S = 2.0
RSS_GOAL_MB = 250
WRITE_VERBS = ("POST", "PATCH", "PUT", "DELETE")
Body = dict[str, Any]


def operator_metrics(port: int) -> dict[str, float]:
    """The operator's API requests so far, by verb."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("pdfleet_kube_requests_total{"):
            series, value = line.rsplit(" ", 1)
            verb = series.split('verb="', 1)[1].split('"', 1)[0]
            out[verb] = out.get(verb, 0.0) + float(value)
    return out


def reconcile_summary(port: int) -> str:
    """How many reconciles the operator ran and their mean duration, and its API answers other than 2xx: where an
    operator slower than the floor spends its time."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    count = total = 0.0
    codes: dict[str, float] = {}
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.startswith("pdfleet_reconcile_duration_seconds_count"):
            count += float(value)
        elif series.startswith("pdfleet_reconcile_duration_seconds_sum"):
            total += float(value)
        elif series.startswith("pdfleet_kube_requests_total{") and not series.split('code="', 1)[1].startswith("2"):
            code = series.split('code="', 1)[1].split('"', 1)[0]
            codes[code] = codes.get(code, 0.0) + float(value)
    answers = ", ".join(f"{n:.0f}x {code}" for code, n in sorted(codes.items())) or "none"
    return f"{count:.0f} reconciles, mean {1000 * total / count if count else 0:.0f} ms; API answers other than 2xx: " \
           f"{answers}"


def writes(m: dict[str, float]) -> float:
    return sum(v for verb, v in m.items() if verb in WRITE_VERBS)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def control_plane_cpu() -> dict[str, float]:
    """CPU seconds the local cluster's apiserver and etcd have used so far: what a scenario costs the control
    plane, which shares this machine's cores with the operator (empty where they are not local processes)."""
    out: dict[str, float] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            name = (proc / "comm").read_text().strip()
            if name in ("kube-apiserver", "etcd"):
                out[name] = out.get(name, 0.0) + cpu_seconds(int(proc.name))
    return out


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def operator(namespace: str, metrics_port: int) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """The operator as the cluster's admin, watching `namespace` only, with the benchmark's workers."""
    # PDFLEET_BENCH_PROFILE=path: run the operator under cProfile and write its profile there.
    profile = ("-m", "cProfile", "-o", os.environ["PDFLEET_BENCH_PROFILE"]) \
        if os.environ.get("PDFLEET_BENCH_PROFILE") else ()
    return running_operator(Path(os.environ["KUBECONFIG"]), ROOT / ".bench-operator.log", namespace,
                            metrics_port=metrics_port, python_options=profile,
                            options=("--workers", str(WORKERS), "--resync-period", str(RESYNC_S)))


class Bench:
    def __init__(self, api: KubeClient, raw: k8s.ApiClient, pools: int, rate: float) -> None:
        self.api = api
        self.raw = raw
        self.names = [f"load-{i:03d}" for i in range(pools)]
        self.rate = rate
        self.results: dict[str, Any] = {"pools": pools, "rate_per_s": rate, "groups_per_pool": PODS_PER_POOL}

    async def _timed(self, kind: str, namespace: str, floor: Floor | None = None) -> list[float]:
        clock = PodClock(self.raw, namespace, self.names)
        async with clock.running():
            t0, cpu0 = time.perf_counter(), control_plane_cpu()
            writer = asyncio.create_task(floor.run(len(self.names))) if floor else None
            await create_pools(self.api, clock, namespace, self.names, self.rate,
                               *([floor.handover] if floor else []))
            done = await clock.wait()
            if writer:
                await writer
            wall, cpu1 = time.perf_counter() - t0, control_plane_cpu()
        latencies = [done[n] for n in self.names]
        cpu = {name: cpu1[name] - cpu0.get(name, 0.0) for name in cpu1}
        self.results[f"{kind}_control_plane_cpu_s"] = cpu
        print(f"   apply -> all {PODS_PER_POOL} pods created: p50 {statistics.median(latencies) * 1000:.0f} ms, "
              f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms; all {len(latencies)} pools in {wall:.1f} s",
              flush=True)
        if cpu:
            print("   meanwhile " + ", ".join(f"{name} used {v:.1f} s of CPU" for name, v in sorted(cpu.items())),
                  flush=True)
        return latencies

    async def _scenario_namespace(self, kind: str) -> str:
        """A fresh namespace (the last run's may still be terminating: settle waits for it), labelled for
        pdfleet-sim to run no processes."""
        print(f"== {kind}: settling the cluster", flush=True)
        self.results[f"{kind}_cluster_at_start"] = await settle(self.api)
        namespace = f"pdfleet-bench-{kind}-{os.getpid()}"
        await self.api.request("POST", "/api/v1/namespaces", body=namespace_body(namespace))
        return namespace

    async def floor(self) -> None:
        namespace = await self._scenario_namespace("floor")
        try:
            floor = Floor(self.api, {n: rendered(namespace, n) for n in self.names})
            print(f"== floor: {len(self.names)} pools written by a client with no logic, created {self._pace()}",
                  flush=True)
            latencies = await self._timed("floor", namespace, floor=floor)
            self.results |= {"floor_p50_s": statistics.median(latencies), "floor_p99_s": percentile(latencies, 0.99),
                             "floor_writes_per_pool": floor.writes / len(self.names)}
        finally:
            await delete_namespace(self.api, namespace)

    async def operator(self) -> None:
        namespace = await self._scenario_namespace("operator")
        metrics_port = free_port()
        try:
            with operator(namespace, metrics_port) as op:
                print(f"== operator: {len(self.names)} pools, created {self._pace()}", flush=True)
                before, cpu_before, t0 = writes(operator_metrics(metrics_port)), cpu_seconds(op.pid), time.monotonic()
                latencies = await self._timed("operator", namespace)
                cpu = cpu_seconds(op.pid) - cpu_before
                print(f"   operator CPU meanwhile: {cpu:.1f} s ({cpu / (time.monotonic() - t0):.0%} of one core)",
                      flush=True)
                total = await self._settled_writes(metrics_port)
                print(f"   {reconcile_summary(metrics_port)}", flush=True)
                steady = await self._steady_writes(metrics_port)
                self.results |= {"operator_p50_s": statistics.median(latencies),
                                 "operator_p99_s": percentile(latencies, 0.99),
                                 "operator_writes_per_pool": (total - before) / len(self.names),
                                 "operator_steady_writes": steady, "operator_peak_rss_mb": peak_rss_mb(op.pid),
                                 "operator_cpu_s": cpu}
        finally:
            await delete_namespace(self.api, namespace)
        print("== waiting for the operator's namespace to go, so the next run starts settled", flush=True)
        await settle(self.api, then="cluster at the end")

    async def _settled_writes(self, port: int, *, timeout: float = 300) -> float:
        """The operator's writes once two resync periods pass without one (pods Ready, status final)."""
        deadline = time.monotonic() + timeout
        last = -1.0
        while (now := writes(operator_metrics(port))) != last and time.monotonic() < deadline:
            last = now
            await asyncio.sleep(2 * RESYNC_S)
        return now

    async def _steady_writes(self, port: int, seconds: float = 15) -> float:
        m0 = operator_metrics(port)
        await asyncio.sleep(seconds)
        steady = writes(operator_metrics(port)) - writes(m0)
        print(f"   steady state over {seconds:.0f} s: {steady:.0f} writes", flush=True)
        return steady

    def _pace(self) -> str:
        return f"{self.rate:g} per second" if self.rate else "back to back"



def report(r: dict[str, Any]) -> None:
    ratio = r["operator_p99_s"] / r["floor_p99_s"]
    r["p99_over_floor"] = ratio
    burst = not r["rate_per_s"]

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    rows = [
        ("apply -> pods p50", f"{r['operator_p50_s'] * 1000:.0f} ms", f"{r['floor_p50_s'] * 1000:.0f} ms", "", ""),
        ("apply -> pods p99", f"{r['operator_p99_s'] * 1000:.0f} ms", f"{r['floor_p99_s'] * 1000:.0f} ms",
         "" if burst else f"< {PACED_P99_GOAL_S:g} s at 2 pools/s",
         "" if burst else verdict(r["operator_p99_s"] < PACED_P99_GOAL_S)),
        ("p99 operator / floor", f"{ratio:.2f}x", "", f"<= {BURST_RATIO_GOAL}x in the burst" if burst else "",
         verdict(ratio <= BURST_RATIO_GOAL) if burst else ""),
        ("API writes per pool", f"{r['operator_writes_per_pool']:.1f}", f"{r['floor_writes_per_pool']:.1f}", "", ""),
        ("peak RSS", f"{r['operator_peak_rss_mb']:.0f} MB", "", f"< {RSS_GOAL_MB} MB",
         verdict(r["operator_peak_rss_mb"] < RSS_GOAL_MB)),
        ("writes at steady state", f"{r['operator_steady_writes']:.0f}", "", "0",
         verdict(r["operator_steady_writes"] == 0)),
    ]
    head = ("", "operator", "floor", "goal", "")
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    pace = "burst" if burst else f"paced at {r['rate_per_s']:g} pools/s"
    print(f"== {r['pools']} pools of {r['groups_per_pool']} groups, {pace}")
    for row in [head, *rows]:
        print("   " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


async def measure(pools: int, rate: float) -> dict[str, Any]:
    cfg = await load_configuration(os.environ["KUBECONFIG"])
    api = KubeClient(cfg)
    try:
        async with k8s.ApiClient(cfg) as raw:
            bench = Bench(api, raw, pools, rate)
            await bench.floor()
            await bench.operator()
            return bench.results
    finally:
        await api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pools", type=int, default=100, help="pools per scenario (default 100)")
    parser.add_argument("--rate", type=float, default=0.0, help="pools created per second (0: back to back)")
    args = parser.parse_args()

    gpu_nodes = max(4, (args.pools * PODS_PER_POOL + 7) // 8 + 1)  # one GPU per engine pod, 8 per node
    os.environ["PDFLEET_GPU_NODES"] = str(gpu_nodes)
    cluster_up()  # creates the nodes that are missing
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    try:
        results = asyncio.run(measure(args.pools, args.rate))
    finally:
        # The extra GPU nodes would slow every later test on this cluster: remove what was added.
        extra = [f"node/pdfleet-gpu-{i}" for i in range(4, gpu_nodes)]
        if extra:
            kubectl("delete", "--wait=false", "--ignore-not-found", *extra, check=False)
    report(results)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
