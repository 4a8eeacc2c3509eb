"""Cost per decode step of token agreement (`SYNC_TOKEN_IDS_ACROSS_TP=1`, which the operator sets for every group of
more than one rank), against the request broadcast every scheduler iteration already makes, in the same run.

For each TP size, that many ranks are forked on a real gloo group on 127.0.0.1. Each runs, block by block in the
order broadcast, sync, sync, broadcast:
- baseline: SGLang's own `broadcast_pyobj` of an empty request list over the group, what every rank of an idle
  or busy scheduler does once per iteration (`recv_requests`);
- agreement: SGLang's own `Sampler._sync_token_ids_across_tp` on a batch of sampled token ids (batch 1, 64, 256),
  the MIN all-reduce its sampler adds to each decode step when the variable is set.

Before timing, each rank checks that the sync left every rank with the same tokens (each starts from its own).
Figures are rank 0's per-call wall times and the ratio of their medians. On a GPU the all-reduce runs over the TP
group's NCCL communicator (`tp_group.device_group`) on a few hundred bytes, beside a forward of milliseconds; here
it runs over gloo on the CPU, so the figures say how it compares with a collective every loop already pays, not
what it costs on a GPU. Nothing is asserted about time (a shared 2-core machine).

    python benchmarks/bench_token_agreement.py [--tp 2 4 8] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCHES = (1, 64, 256)
RUN_TIMEOUT_S = 300.0

RANK = Path(__file__).with_name("token_agreement_rank.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(tp: int, calls: int, workdir: Path) -> dict[str, dict[str, list[int]]]:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", SYNC_TOKEN_IDS_ACROSS_TP="1", PYTHONWARNINGS="ignore")
    port, out = free_port(), workdir / f"tp{tp}.json"
    batches = ",".join(str(b) for b in BATCHES)
    procs = [subprocess.Popen([sys.executable, str(RANK), str(r), str(tp), str(port), str(calls), str(out), batches],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for r in range(tp)]
    errors = []
    for rank, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise SystemExit(f"TP {tp}: rank {rank} did not finish in {RUN_TIMEOUT_S:.0f} s") from None
        if proc.returncode != 0:
            errors.append(f"rank {rank} exited {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
    if errors:
        raise SystemExit(f"TP {tp}: " + "\n".join(errors))
    return dict(json.loads(out.read_text()))


def micros(values: list[int]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"{statistics.median(values) / 1000:8.1f} us (p99 {p99 / 1000:7.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--quick", action="store_true", help="fewer calls per block")
    options = parser.parse_args()
    print(f"{'TP':>3} {'batch':>6}  {'request broadcast (baseline)':>30}  {'token agreement':>28}  ratio")
    with tempfile.TemporaryDirectory(prefix="pdfleet-bench-token-") as tmp:
        for tp in options.tp:
            calls = (50 if options.quick else 200) // max(1, tp // 2)
            report = run(tp, calls, Path(tmp))
            for batch in BATCHES:
                row = report[str(batch)]
                ratio = statistics.median(row["agreement"]) / statistics.median(row["broadcast"])
                print(f"{tp:>3} {batch:>6}  {micros(row['broadcast']):>30}  {micros(row['agreement']):>28}  "
                      f"{ratio:.2f}x", flush=True)


if __name__ == "__main__":
    main()
