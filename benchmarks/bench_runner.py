"""The pod runner's cost per simulated engine pod: memory (PSS), idle CPU, and pod create -> Ready time.

Every engine pod is a process tree under `pdfleet-sim`: the container's process, forked from the runner's
zygote (which imported SGLang once) in a session of its own, and the rank processes it starts. A pod's
processes are found as the runner's descendants that share that session, and the pod by the container's
working directory or stdout (both in the pod's directory `<cluster dir>/pods/<namespace>/<pod>/`).

PSS is the honest memory figure for forked processes: pages still shared with the zygote are split among all
that share them, so the sum over every process is the real total (RSS, printed for comparison, counts shared
pages once per process). Baseline, in the same run before the pool exists: the runner alone (its own process
and the zygote's: PSS and CPU over the same idle window). Reported per pod: PSS and RSS (median, max), idle
CPU %, and also the runner tree's growth divided by the pods (what one more pod costs the machine). Idle here
means no requests: the simulator's ranks run their idle loop and the operator polls each agent once per
heartbeat, as in a real fleet.

Needs the local cluster with the pod runner and the engine simulator (`make cluster-up`). A few minutes.

    python benchmarks/bench_runner.py [--idle 30] [--prefill 2] [--decode 8]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import localfleet
from localfleet import Api

POOL = "runner"
PAGE_KB = 1.0 / 1024  # smaps_rollup counts in kB
TICK = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    session: int
    cpu_s: float  # utime + stime


def read_proc(pid: int) -> Proc | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command: state ppid pgrp session ... utime (11) stime (12)
    return Proc(pid, int(fields[1]), int(fields[3]), (int(fields[11]) + int(fields[12])) / TICK)


def descendants(root: int) -> dict[int, Proc]:
    procs = {p.pid: p for pid in os.listdir("/proc") if pid.isdigit() and (p := read_proc(int(pid)))}
    children: dict[int, list[int]] = collections.defaultdict(list)
    for p in procs.values():
        children[p.ppid].append(p.pid)
    out: dict[int, Proc] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            out[pid] = procs[pid]
            todo += children[pid]
    return out


def memory_mb(pid: int) -> tuple[float, float]:
    """(PSS, RSS) in MB, 0 for a process that is gone."""
    pss = rss = 0.0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * PAGE_KB
            elif line.startswith("Rss:"):
                rss = int(line.split()[1]) * PAGE_KB
    except OSError:
        pass
    return pss, rss


def pod_of(pid: int, pods_dir: Path) -> str | None:
    """`namespace/pod` of a container process, from its working directory or its stdout (the pod's log)."""
    for link in (f"/proc/{pid}/cwd", f"/proc/{pid}/fd/1"):
        try:
            where = Path(os.readlink(link))
        except OSError:
            continue
        if where.is_relative_to(pods_dir):
            parts = where.relative_to(pods_dir).parts
            if len(parts) >= 2:
                return f"{parts[0]}/{parts[1]}"
    return None


def runner_pid(cluster_dir: Path) -> int:
    pid = int((cluster_dir / "run" / "pdfleet-sim.pid").read_text().strip())
    if read_proc(pid) is None:
        raise SystemExit(f"the pod runner (pid {pid}) is not running; `make cluster-up` starts it")
    return pid


def split(runner: int, pods_dir: Path) -> tuple[list[int], dict[str, list[int]]]:
    """The runner's own processes (itself, the zygote, anything not in a pod) and each pod's, by pod."""
    tree = descendants(runner)
    sessions: dict[int, list[int]] = collections.defaultdict(list)
    for p in tree.values():
        sessions[p.session].append(p.pid)
    own: list[int] = []
    pods: dict[str, list[int]] = collections.defaultdict(list)
    for session, pids in sessions.items():
        pod = pod_of(session, pods_dir) if session in tree and session != runner else None
        if pod is None:
            own += pids
        else:
            pods[pod] += pids
    return own, dict(pods)


def cpu_s(pids: list[int]) -> float:
    return sum(p.cpu_s for pid in pids if (p := read_proc(pid)))


def idle_cpu(groups: dict[str, list[int]], seconds: float) -> dict[str, float]:
    """Each group's CPU over `seconds`, as a percentage of one core (processes alive at both ends)."""
    before = {name: {pid: read_proc(pid) for pid in pids} for name, pids in groups.items()}
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    out = {}
    for name, procs in before.items():
        used = 0.0
        for pid, start in procs.items():
            end = read_proc(pid)
            if start is not None and end is not None:
                used += end.cpu_s - start.cpu_s
        out[name] = 100 * used / elapsed
    return out


def total_mb(pids: list[int]) -> tuple[float, float]:
    pss, rss = zip(*(memory_mb(pid) for pid in pids), strict=True) if pids else ((0.0,), (0.0,))
    return sum(pss), sum(rss)


def time_to_ready(api: Api, namespace: str, expected: int, timeout: float) -> dict[str, float]:
    """Seconds from each pod first seen to it first seen Ready, polled every 100 ms (creationTimestamp and
    the condition's transition time have a resolution of one second, too coarse)."""
    seen: dict[str, float] = {}
    ready: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while (len(ready) < expected or len(seen) < expected) and time.monotonic() < deadline:
        now = time.monotonic()
        for pod in api.pods(namespace, localfleet.engine_selector(POOL)):
            name = pod["metadata"]["name"]
            seen.setdefault(name, now)
            if name not in ready and localfleet.is_ready(pod):
                ready[name] = now
        time.sleep(0.1)
    if len(ready) < expected:
        raise SystemExit(f"only {len(ready)} of {expected} pods Ready after {timeout:.0f} s")
    return {name: ready[name] - seen[name] for name in ready}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--idle", type=float, default=30, help="seconds of idle CPU measured, each time")
    parser.add_argument("--prefill", type=int, default=2, help="prefill groups at TP 2")
    parser.add_argument("--decode", type=int, default=8, help="decode groups at TP 1")
    args = parser.parse_args()

    kubeconfig = localfleet.cluster_up()
    cluster_dir = kubeconfig.parent
    pods_dir = cluster_dir / "pods"
    runner = runner_pid(cluster_dir)
    localfleet.install_chart()
    namespace = f"pdfleet-bench-runner-{os.getpid()}"
    localfleet.kubectl("create", "namespace", namespace)
    api = Api(kubeconfig)
    try:
        own, pods = split(runner, pods_dir)
        others = len(pods)
        if pods:
            print(f"note: the runner also plays {len(pods)} pod(s) of others: {sorted(pods)}; their processes are "
                  f"left out, but the runner's CPU includes their probes and its PSS shares pages with them")
        base_pss, base_rss = total_mb(own)
        base_tree = base_pss + total_mb([pid for pids in pods.values() for pid in pids])[0]
        base_cpu = idle_cpu({"runner": own}, args.idle)["runner"]
        print(f"baseline, the runner alone ({len(own)} processes: runner and zygote): PSS {base_pss:.0f} MB, "
              f"RSS {base_rss:.0f} MB, idle CPU {base_cpu:.2f}% of a core over {args.idle:.0f} s; "
              f"loadavg {localfleet.loadavg()}")

        with tempfile.TemporaryDirectory(prefix="pdfleet-bench-") as tmp, \
                localfleet.running_operator(localfleet.token_kubeconfig(kubeconfig, Path(tmp) / "kubeconfig"),
                                            Path(tmp) / "operator.log", namespace) as _op:
            expected = args.prefill + args.decode
            localfleet.apply(localfleet.pool_body(
                namespace, POOL, prefill={"replicas": args.prefill, "tp": 2, "gpusPerNode": 2},
                decode={"replicas": args.decode, "tp": 1, "gpusPerNode": 1}, router={"replicas": 0}))
            started = time.monotonic()
            ready_s = time_to_ready(api, namespace, expected, timeout=300)
            all_ready = time.monotonic() - started
            localfleet.wait_for("every group Healthy", lambda: sum(
                g.get("verdict") == "Healthy" for g in localfleet.groups(api.pool(namespace, POOL)).values())
                == expected, timeout=120)
            time.sleep(5)  # past the start-up work (first polls, first status writes)

            own, pods = split(runner, pods_dir)
            others = max(others, len(pods) - expected)
            ours = {name: pids for name, pids in pods.items() if name.startswith(f"{namespace}/")}
            if len(ours) != expected:
                print(f"warning: found the processes of {len(ours)} of {expected} pods: {sorted(ours)}")
            cpu = idle_cpu({"runner": own, **ours}, args.idle)
            memory = {name: total_mb(pids) for name, pids in ours.items()}
            own_pss = total_mb(own)[0]
            tree = total_mb([pid for pids in pods.values() for pid in pids])[0] + own_pss
            print(f"{len(ours)} pods ({args.prefill} prefill TP 2, {args.decode} decode TP 1) Ready "
                  f"{all_ready:.1f} s after apply; loadavg {localfleet.loadavg()}")
            for name in sorted(ours):
                pss, rss = memory[name]
                print(f"  {name.split('/', 1)[1]}: {len(ours[name])} processes, PSS {pss:.0f} MB, RSS {rss:.0f} MB, "
                      f"idle CPU {cpu[name]:.2f}%, create -> Ready {ready_s.get(name.split('/', 1)[1], 0):.2f} s")
    finally:
        localfleet.delete_namespace(api, namespace)
        api.close()

    pss = [m[0] for m in memory.values()]
    rss = [m[1] for m in memory.values()]
    per_cpu = [cpu[name] for name in ours]
    # Pages a pod shares with the zygote move PSS from the zygote to the pod; only the tree's total is conserved.
    grown = (tree - base_tree) / max(1, len(ours))
    print(f"runner and zygote with the pods: PSS {own_pss:.0f} MB (alone: {base_pss:.0f} MB), "
          f"idle CPU {cpu['runner']:.2f}% (alone: {base_cpu:.2f}%)")
    pss_med, rss_med = statistics.median(pss), statistics.median(rss)
    print(f"PSS per pod: median {pss_med:.0f} MB, max {max(pss):.0f} MB ({pss_med / base_pss:.2f}x the runner "
          f"alone); RSS per pod: median {rss_med:.0f} MB ({rss_med / max(pss_med, 1e-9):.1f}x its PSS)")
    if others:  # shared pages move between every process that maps them, others' pods included
        print(f"the runner tree's growth per pod: not reported, {others} pod(s) of others ran meanwhile")
    else:
        print(f"the runner tree's PSS grew {grown:.0f} MB per pod ({len(ours)} pods)")
    # Over 30 s one clock tick is 0.03%: a runner that used less has no meaningful ratio.
    ratio = f"{statistics.median(per_cpu) / base_cpu:.1f}x" if base_cpu >= 0.05 else "n/a: under 0.05% for"
    print(f"idle CPU per pod: median {statistics.median(per_cpu):.2f}%, max {max(per_cpu):.2f}% of a core "
          f"({ratio} the runner alone); all pods {sum(per_cpu):.1f}%")
    times = list(ready_s.values())
    print(f"pod create -> Ready: median {statistics.median(times):.2f} s, max {max(times):.2f} s (seen by "
          f"polling every 100 ms)")


if __name__ == "__main__":
    main()
