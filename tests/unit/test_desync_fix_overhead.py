"""The machinery of `make bench`'s desync-fix cost (benchmarks/bench_desync_fixes.py): one short run of
tests/repro/overhead.py at 2 ranks on a real gloo group. The figures are not judged (a shared machine); what
is: the two variants really are SGLang's own functions and the patched ones, switched in the same ranks, they
enter the collectives the patches are meant to add, and they do the same thing to every request."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.repro import group
from tests.support import forkserver

FIXES = ("kv-poll-lockstep", "abort-consensus", "health-check-consensus", "retraction-consensus",
         "admission-consensus")
TIMEOUT_S = 180.0  # SGLang's import on a loaded 2-core machine, then 2 x 6 blocks of 10 iterations per workload
# Collective calls per iteration, unpatched -> patched, by role and workload. Decode idle: SGLang enters only the
# request broadcast; the fixes add the retraction gate's all-reduce and the handshake and transfer exchanges.
# Decode busy: SGLang polls both queues itself; the gate is the one addition. Decoding: the memory check's
# agreement, once per step (nothing retracts). Resuming: admission-consensus's capacity agreement, once per
# call (SGLang's resume enters none). Prefill idle: the bootstrap, waiting-queue, chunk and inflight
# exchanges (attention CP is 1: one group each). Prefill busy: SGLang polls three queues itself; the chunk
# exchange is the addition (no chunked request: SGLang's gate skips its poll). Admitting: admission-consensus's
# capacity agreement over attention TP, once per get_new_batch_prefill call (SGLang's admission enters none;
# attention CP is 1, a group of one, so its second all-reduce is skipped).
COLLECTIVES = {
    "decode": {"idle": (1.0, 4.0), "busy": (4.0, 5.0), "decoding": (1.0, 2.0), "resuming": (0.0, 1.0)},
    "prefill": {"idle": (1.0, 5.0), "busy": (5.0, 6.0), "admitting": (0.0, 1.0)},
}


def _run(tmp_path: Path, role: str) -> list[dict[str, Any]]:
    args = ["--world", "2", "--iterations", "10", "--rounds", "1", "--workdir", str(tmp_path), "--role", role,
            "--patches", *FIXES]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1")
    log = tmp_path / "overhead.log"
    # `python -m tests.repro.overhead ...`, forked with SGLang already imported (tests/support/forkserver.py).
    proc = forkserver.shared().spawn("tests.repro.overhead", args, env=env, log=log)
    try:
        proc.wait(timeout=TIMEOUT_S)
    finally:
        group.kill(proc)  # the ranks too, whatever happened
    assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]
    return [json.loads((tmp_path / f"overhead-rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("role", sorted(COLLECTIVES))
def test_the_overhead_run_switches_between_sglang_and_the_fixes_in_the_same_ranks(tmp_path: Path, role: str) -> None:
    for report in _run(tmp_path, role):
        assert sorted(report["applied"]) == sorted(FIXES)
        assert report["patched_targets"]["unpatched"] == {}
        patched = report["patched_targets"]["patched"]
        assert set(patched.values()) == set(FIXES)
        assert {"DecodeTransferQueue.pop_transferred", "Scheduler.abort_request", "Scheduler.is_fully_idle",
                "ScheduleBatch.check_decode_mem", "DecodePreallocQueue.resume_retracted_reqs",
                "Scheduler._get_new_batch_prefill_raw"} <= set(patched)

        workloads = report["workloads"]
        assert {name: (w["collectives"]["unpatched"], w["collectives"]["patched"]) for name, w in
                workloads.items()} == COLLECTIVES[role]
        for workload in workloads.values():
            # One warm-up block per variant is left out; 2 measured blocks of 10 iterations each remain.
            assert {v: len(times) for v, times in workload["iteration_ns"].items()} == {"unpatched": 20,
                                                                                     "patched": 20}
            outcomes = [o for blocks in workload["outcomes"].values() for o in blocks]
            assert all(o == outcomes[0] for o in outcomes)
        busy = workloads["busy"]["outcomes"]["patched"][0]
        assert busy["transferred"] and not busy["dropped"], "the busy load must carry requests through"
        if role == "decode":
            assert busy["finished"], "the busy load must decode requests"
            assert workloads["decoding"]["outcomes"]["patched"][0]["batches"][-1] == [f"req-{i}" for i in range(4)]
            assert workloads["resuming"]["outcomes"]["patched"][0]["resumed"][-1] == ["req-0", "req-1", "req-2"]
        else:
            assert workloads["admitting"]["outcomes"]["patched"][0]["admitted"][-1] == [
                f"admit-9-{i}" for i in range(3)], "SGLang's admission must batch every waiting request"
