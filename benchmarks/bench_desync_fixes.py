"""Cost per loop iteration of the desync fixes, against the unpatched loop in the same run.

For each TP size (2, 4, 8) and role (decode, prefill), one run of the reproduction harness
(`tests.repro.overhead`) forks that many ranks on a real gloo group on 127.0.0.1. Each rank runs SGLang
0.5.23's own loop steps with nothing diverging (decode: request broadcast, `process_decode_queue`, the prealloc
handshake and transfer polls, and `update_running_batch` on a running batch; prefill: request broadcast, the
bootstrap, waiting-queue, chunk and inflight polls, and SGLang's own prefill admission), and switches its SGLang
functions between the shipped ones and the patched ones (every desync fix in the catalogue, installed once by
pdfleet's patch framework) block by block, in the order unpatched, patched, patched, unpatched. So both variants
run in the same processes, on the same gloo group, under the same load.

Workloads: `idle` (no request: unpatched SGLang enters only the request broadcast, its poll guards skip the
rest; the patched loop still exchanges every iteration: the worst case), `busy` (a request arrives in each of
two queues every iteration) and, for decode, `decoding` (a running batch of 4 through `update_running_batch`,
where retraction-consensus agrees the memory check every step) and `resuming` (`resume_retracted_reqs` over
three retracted requests, where admission-consensus agrees the free capacity; the call alone) and, for prefill,
`admitting` (`get_new_batch_prefill` with SGLang's PrefillAdder over a real radix cache and KV pools, three waiting
requests that fit, fresh pools each call, where admission-consensus agrees the capacity every prefill iteration;
the call alone: the prefill loops admit with a fixed stand-in). The loops have no forward: a real iteration
adds a model forward (milliseconds on a GPU) to both variants, so the ratios here are upper bounds and the added
time per iteration is the figure that carries over. Figures are rank 0's
per-iteration wall times. Nothing is asserted about time (a shared 2-core machine); the run fails only if the
harness does, or if the two variants did not do the same thing to every request.

    python benchmarks/bench_desync_fixes.py [--tp 2 4 8] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The catalogue's desync fixes that act in this decode loop. grammar-consensus is left out: it enters no collective
# without grammar requests, and the loop has none.
DESYNC_FIXES = ("kv-poll-lockstep", "abort-consensus", "health-check-consensus", "retraction-consensus",
                "admission-consensus", "flush-consensus")
ROLES = ("decode", "prefill")
# (iterations per block, rounds of unpatched-patched-patched-unpatched): TP 8 forks 8 ranks that share the
# machine's cores, so it runs fewer iterations (its p99 is then close to the maximum).
PLAN = {2: (50, 2), 4: (40, 2), 8: (20, 1)}
QUICK = {2: (20, 1), 4: (20, 1), 8: (10, 1)}
RUN_TIMEOUT_S = 240.0


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def run(tp: int, role: str, iterations: int, rounds: int, workdir: Path) -> dict[str, Any]:
    """One harness run of `role`'s loops at `tp` ranks; rank 0's report."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1")
    argv = [sys.executable, "-m", "tests.repro.overhead", "--world", str(tp), "--iterations", str(iterations),
            "--rounds", str(rounds), "--workdir", str(workdir), "--role", role, "--patches", *DESYNC_FIXES]
    log = workdir / "launcher.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the ranks are the launcher's children, in its session
        proc.wait()
    if rc != 0:
        what = f"did not finish in {RUN_TIMEOUT_S:.0f} s" if rc is None else f"exited {rc}"
        raise SystemExit(f"TP {tp} {role}: the harness {what}:\n{log.read_text(errors='replace')[-3000:]}")
    return dict(json.loads((workdir / "overhead-rank0.json").read_text()))


def check(tp: int, role: str, report: dict[str, Any]) -> list[str]:
    """What makes a run's figures meaningless: the variants not being what they claim, or doing different
    things to a request."""
    problems = []
    targets = report["patched_targets"]
    if targets["unpatched"]:
        problems.append(f"TP {tp} {role}: the unpatched blocks ran patched functions: "
                        f"{sorted(targets['unpatched'])}")
    if set(targets["patched"].values()) != set(DESYNC_FIXES):
        problems.append(f"TP {tp} {role}: the patched blocks ran {sorted(set(targets['patched'].values()))}, "
                        f"not {sorted(DESYNC_FIXES)}")
    for name, workload in report["workloads"].items():
        outcomes = [o for variant in workload["outcomes"].values() for o in variant]
        if any(o != outcomes[0] for o in outcomes):
            problems.append(f"TP {tp} {role} {name}: the patched and unpatched blocks treated requests differently")
    return problems


def rows(tp: int, role: str, report: dict[str, Any]) -> list[str]:
    lines = []
    for name, workload in report["workloads"].items():
        times = workload["iteration_ns"]
        base, fixed = times["unpatched"], times["patched"]
        med_b, med_f = statistics.median(base) / 1e3, statistics.median(fixed) / 1e3
        p99_b, p99_f = percentile(base, 0.99) / 1e3, percentile(fixed, 0.99) / 1e3
        calls = workload["collectives"]
        lines.append(
            f"{tp:>3} {role:<7} {name:<9} {len(base):>7} {calls['unpatched']:>4.1f} -> {calls['patched']:<4.1f}"
            f" {med_b:>9.0f} {med_f:>9.0f} {med_f / med_b:>6.2f}x {med_f - med_b:>+8.0f}"
            f" {p99_b:>9.0f} {p99_f:>9.0f} {p99_f / p99_b:>6.2f}x"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, nargs="+", default=sorted(PLAN), choices=sorted(PLAN))
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = parser.parse_args()
    plan = QUICK if args.quick else PLAN
    print(f"patches: {', '.join(DESYNC_FIXES)} vs SGLang's own functions, switched block by block in the same "
          "ranks; no forward in the loop (ratios are upper bounds; the added us carry over)")
    for tp in args.tp:
        iterations, rounds = plan[tp]
        print(f"TP {tp}: {2 * rounds} blocks of {iterations} iterations per variant and workload, after one "
              "warm-up block each" + (" (fewer at TP 8: 8 ranks share this machine's cores)" if tp == 8 else ""))
    print(f"{'TP':>3} {'loop':<7} {'load':<9} {'samples':>7} {'collectives':<11} {'median us':>9} {'':>9} {'ratio':>7}"
          f" {'added us':>8} {'p99 us':>9} {'':>9} {'ratio':>7}")
    print(f"{'':>3} {'':<7} {'':<9} {'/variant':>7} {'per iter':<11} {'unpatched':>9} {'patched':>9} {'':>7} {'':>8}"
          f" {'unpatched':>9} {'patched':>9}")
    problems = []
    for tp in args.tp:
        iterations, rounds = plan[tp]
        for role in ROLES:
            started = time.monotonic()
            with tempfile.TemporaryDirectory(prefix=f"pdfleet-bench-desync-tp{tp}-{role}-") as workdir:
                report = run(tp, role, iterations, rounds, Path(workdir))
            problems += check(tp, role, report)
            for line in rows(tp, role, report):
                print(line, flush=True)
            print(f"    (TP {tp} {role} took {time.monotonic() - started:.0f} s, SGLang's import included)")
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
