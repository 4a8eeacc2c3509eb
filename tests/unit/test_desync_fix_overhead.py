"""The machinery of `make bench`'s desync-fix cost (benchmarks/bench_desync_fixes.py): one short run of
tests/repro/overhead.py at 2 ranks on a real gloo group. The figures are not judged (a shared machine); what
is: the two variants really are SGLang's own functions and the patched ones, switched in the same ranks, they
enter the collectives the patches are meant to add, and they do the same thing to every request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.repro import group

FIXES = ("kv-poll-lockstep", "abort-consensus")
TIMEOUT_S = 180.0  # SGLang's import on a loaded 2-core machine, then 2 x 6 blocks of 10 iterations


def test_the_overhead_run_switches_between_sglang_and_the_fixes_in_the_same_ranks(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "tests.repro.overhead", "--world", "2", "--iterations", "10", "--rounds", "1",
            "--workdir", str(tmp_path), "--patches", *FIXES]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(argv, cwd=group.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        group.kill(proc)  # the ranks too, whatever happened
    assert proc.returncode == 0, output.decode(errors="replace")[-3000:]

    for rank in range(2):
        report = json.loads((tmp_path / f"overhead-rank{rank}.json").read_text())
        assert sorted(report["applied"]) == sorted(FIXES)
        assert report["patched_targets"]["unpatched"] == {}
        patched = report["patched_targets"]["patched"]
        assert set(patched.values()) == set(FIXES)
        assert {"DecodeTransferQueue.pop_transferred", "Scheduler.abort_request"} <= set(patched)

        idle, busy = report["workloads"]["idle"], report["workloads"]["busy"]
        # Idle: SGLang enters only the request broadcast; the fixes add the retraction gate's all-reduce and the
        # handshake and transfer exchanges. Busy: SGLang polls both queues itself; the gate is the one addition.
        assert idle["collectives"] == {"unpatched": 1.0, "patched": 4.0}
        assert busy["collectives"] == {"unpatched": 4.0, "patched": 5.0}
        for workload in (idle, busy):
            # One warm-up block per variant is left out; 2 measured blocks of 10 iterations each remain.
            assert {v: len(times) for v, times in workload["iteration_ns"].items()} == {"unpatched": 20,
                                                                                     "patched": 20}
            outcomes = [o for blocks in workload["outcomes"].values() for o in blocks]
            assert all(o == outcomes[0] for o in outcomes)
        finished = busy["outcomes"]["patched"][0]["finished"]
        assert finished and not busy["outcomes"]["patched"][0]["dropped"], "the busy load must decode requests"
