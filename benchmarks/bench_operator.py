"""Operator under load: 100 InferencePools of 8 engine groups each on kwok GPU nodes.

Reports, against a baseline of one pool alone measured in the same run:
- time from creating a pool to all its engine pods existing (median, p99, ratio to the baseline),
- API writes per pool (the operator's own request counter),
- the operator's peak RSS,
- the operator's request rate at steady state (nothing changing).
Targets from the operator issue: p99 under 2 s per pool, RSS under 250 MB, zero writes at steady state.
Needs the local cluster (`make cluster-up`); it adds GPU nodes as needed and deletes its namespace after.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch

from pdfleet.operator.kube.client import KubeClient, load_configuration

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = f"pdfleet-bench-{os.getpid()}"  # a fresh one each run: the last may still be terminating
GROUPS_PER_ROLE = 4  # 8 groups per pool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def localcluster(*args: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "hack" / "localcluster.py"), *args], text=True,
                         capture_output=True, env=env or os.environ.copy())
    if out.returncode != 0:
        raise SystemExit(f"localcluster {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


def pool(name: str) -> dict:
    body = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
    body = copy.deepcopy(body)
    body["metadata"] = {"name": name, "namespace": NAMESPACE}
    body["spec"]["prefill"]["replicas"] = GROUPS_PER_ROLE
    body["spec"]["decode"]["replicas"] = GROUPS_PER_ROLE
    return body


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("pdfleet_kube_requests_total{"):
            series, value = line.rsplit(" ", 1)
            verb = series.split('verb="', 1)[1].split('"', 1)[0]
            out[verb] = out.get(verb, 0.0) + float(value)
    return out


def writes(m: dict[str, float]) -> float:
    return sum(v for verb, v in m.items() if verb in ("POST", "PATCH", "PUT", "DELETE"))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def create_and_time(api: KubeClient, names: list[str], expected_pods: int,
                          rate: float = 0.0) -> dict[str, float]:
    """Creates the pools (back to back, or `rate` per second) and returns, per pool, seconds from its creation
    to all of its pods existing."""
    cfg = await load_configuration(os.environ["KUBECONFIG"])
    started: dict[str, float] = {}
    seen: dict[str, set[str]] = {n: set() for n in names}
    done: dict[str, float] = {}
    async with k8s.ApiClient(cfg) as raw:
        core = k8s.CoreV1Api(raw)
        w = watch.Watch()
        ready = asyncio.Event()

        async def observe() -> None:
            ready.set()
            async for event in w.stream(core.list_namespaced_pod, NAMESPACE, timeout_seconds=600,
                                        label_selector="app.kubernetes.io/managed-by=pdfleet"):
                pod = event["object"]
                pool_name = (pod.metadata.labels or {}).get("pdfleet.dev/pool")
                if pool_name in seen and pool_name not in done:
                    seen[pool_name].add(pod.metadata.name)
                    if len(seen[pool_name]) == expected_pods:
                        done[pool_name] = time.perf_counter() - started[pool_name]
                        if len(done) == len(names):
                            w.stop()
                            return

        watcher = asyncio.create_task(observe())
        await ready.wait()
        t0 = time.perf_counter()
        for i, name in enumerate(names):
            if rate > 0:
                await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            started[name] = time.perf_counter()
            await api.create(pool(name))
        await asyncio.wait_for(watcher, timeout=600)
    return done


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(pools: int, metrics_port: int, operator_pid: int, rate: float) -> None:
    api = KubeClient(await load_configuration(os.environ["KUBECONFIG"]))
    try:
        for _ in range(100):
            try:
                metrics(metrics_port)
                break
            except OSError:
                await asyncio.sleep(0.1)
        pods_per_pool = 2 * GROUPS_PER_ROLE
        print(f"== baseline: 1 pool of {pods_per_pool} groups, alone")
        base = await create_and_time(api, ["baseline"], pods_per_pool)
        base_s = base["baseline"]
        print(f"   apply -> all pods created: {base_s * 1000:.0f} ms")

        before = writes(metrics(metrics_port))
        cpu_before = cpu_seconds(operator_pid)
        names = [f"load-{i:03d}" for i in range(pools)]
        pace = f"{rate:g} per second" if rate else "back to back"
        print(f"== load: {pools} pools of {pods_per_pool} groups, created {pace}")
        t0 = time.perf_counter()
        done = await create_and_time(api, names, pods_per_pool, rate)
        wall = time.perf_counter() - t0
        latencies = list(done.values())
        med, p99 = statistics.median(latencies), percentile(latencies, 0.99)
        print(f"   apply -> all pods created: median {med * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms "
              f"(p99 / baseline = {p99 / base_s:.2f}x), all {pools} pools in {wall:.1f} s")
        cpu = cpu_seconds(operator_pid) - cpu_before
        print(f"   operator CPU meanwhile: {cpu:.1f} s ({cpu / wall:.0%} of one core; the machine has "
              f"{os.cpu_count()} cores for the apiserver, etcd, scheduler, kwok and the operator)")

        # Settle: wait until a resync period passes with no writes.
        last = -1.0
        while (now := writes(metrics(metrics_port))) != last:
            last = now
            await asyncio.sleep(6)
        print(f"   API writes per pool: {(last - before) / pools:.1f}")
        m0, t_s = metrics(metrics_port), time.perf_counter()
        await asyncio.sleep(15)
        m1, dt = metrics(metrics_port), time.perf_counter() - t_s
        steady_rate = (sum(m1.values()) - sum(m0.values())) / dt
        steady_writes = writes(m1) - writes(m0)
        print(f"== steady state over {dt:.0f} s: {steady_rate:.2f} requests/s, {steady_writes:.0f} writes "
              f"(target: 0 writes)")
        rss = peak_rss_mb(operator_pid)
        print(f"== operator peak RSS: {rss:.0f} MB (target < 250 MB)")
        print(json.dumps({"pools": pools, "rate_per_s": rate, "groups_per_pool": pods_per_pool,
                          "baseline_ms": base_s * 1000,
                          "median_ms": med * 1000, "p99_ms": p99 * 1000, "p99_over_baseline": p99 / base_s,
                          "writes_per_pool": (last - before) / pools, "steady_writes": steady_writes,
                          "steady_requests_per_s": steady_rate, "peak_rss_mb": rss, "operator_cpu_s": cpu}))
    finally:
        await api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pools", type=int, default=100)
    parser.add_argument("--rate", type=float, default=0.0, help="pools created per second (0: back to back)")
    args = parser.parse_args()

    gpu_nodes = max(4, (args.pools * 2 * GROUPS_PER_ROLE + 7) // 8 + 1)
    env = os.environ | {"PDFLEET_GPU_NODES": str(gpu_nodes)}
    localcluster("up", env=env)
    localcluster("nodes", env=env)
    for line in localcluster("env").splitlines():
        key, value = line.removeprefix("export ").split("=", 1)
        os.environ[key] = value.replace("$PATH", os.environ["PATH"])
    subprocess.run(["kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds")],
                   check=True, capture_output=True)
    subprocess.run(["kubectl", "create", "namespace", NAMESPACE], capture_output=True)

    metrics_port = free_port()
    with (ROOT / ".bench-operator.log").open("w") as log:
        # PDFLEET_BENCH_PROFILE=path: run the operator under cProfile and write its profile there.
        profile = ["-m", "cProfile", "-o", os.environ["PDFLEET_BENCH_PROFILE"]] \
            if os.environ.get("PDFLEET_BENCH_PROFILE") else []
        op = subprocess.Popen([sys.executable, *profile, "-m", "pdfleet.operator", "--kubeconfig",
                               os.environ["KUBECONFIG"],
                               "--namespace", NAMESPACE, "--metrics-port", str(metrics_port), "--health-port", "0",
                               "--bind-address", "127.0.0.1", "--workers", "8", "--resync-period", "5"],
                              stdout=log, stderr=subprocess.STDOUT)
        try:
            asyncio.run(measure(args.pools, metrics_port, op.pid, args.rate))
        finally:
            op.terminate()
            op.wait(timeout=30)
            subprocess.run(["kubectl", "delete", "namespace", NAMESPACE, "--wait=false"], capture_output=True)
            # The extra GPU nodes would slow every later test on this cluster: remove what was added.
            extra = [f"node/pdfleet-gpu-{i}" for i in range(4, gpu_nodes)]
            if extra:
                subprocess.run(["kubectl", "delete", "--wait=false", "--ignore-not-found", *extra],
                               capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
