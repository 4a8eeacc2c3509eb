"""SGLang's two object all-gathers in the scheduler loop, entered from their real callers on a real gloo group
(tests/support/gather_rank.py): a rank waiting in one for a peer that has not entered yet reads as its own
collective phase in the ledger, and as a collective in the agent's answer; once both ranks are through, each is
out of it, having counted exactly the audited gathers (not the unaudited one each rank runs afterwards)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdfleet.runtime.health import ledger, procs, records, report
from pdfleet.runtime.health.phases import Phase
from tests.repro.group import REPO, free_port, wait_for
from tests.support import gather_rank, requires


def slots(path: Path) -> list[records.RankRecord]:
    try:
        with ledger.Ledger.open_readonly(path) as led:
            return list(led.read_all())
    except (FileNotFoundError, ledger.LedgerError):
        return []


def in_phase(path: Path, slot: int, phase: Phase) -> bool:
    return any(r.slot == slot and r.phase is phase for r in slots(path))


@pytest.mark.parametrize(("which", "phase", "expected"), [
    ("grammar", Phase.GRAMMAR_READY_GATHER, ["grammar-req"]),
    ("vmm", Phase.VMM_ERROR_GATHER, list(gather_rank.VMM_ERRORS)),
])
def test_a_rank_waiting_in_the_gather_reads_as_its_phase_until_its_peer_enters(
        tmp_path: Path, which: str, phase: Phase, expected: list[str | None]) -> None:
    requires.installed("sglang")
    path, port = tmp_path / "ledger", free_port()
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "GLOO_SOCKET_IFNAME": "lo"}
    logs = [tmp_path / f"rank{rank}.out" for rank in range(gather_rank.WORLD)]
    ranks = []
    for rank, log in enumerate(logs):
        with log.open("w") as out:  # files, not pipes: a rank that fills a pipe nobody reads would block
            ranks.append(subprocess.Popen(
                [sys.executable, "-m", "tests.support.gather_rank", str(path), str(rank), str(port), which],
                cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, text=True))
    try:
        assert wait_for(lambda: in_phase(path, 0, phase), timeout_s=240), \
            f"rank 0 never read as {phase.label}: {[(r.slot, r.phase) for r in slots(path)]}"
        waiting = report.to_json(report.build(slots(path), now_ns=time.monotonic_ns(), ledger=str(path),
                                              alive=lambda r: procs.is_alive(r.pid, r.pid_start)))
        assert [(e["slot"], e["phase"]) for e in waiting["ranks"] if e["collective"]] == [(0, phase.label)]

        ranks[1].communicate("go\n", timeout=240)  # only now does the peer enter
        ranks[0].wait(timeout=240)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    outputs = [log.read_text() for log in logs]
    for p, out in zip(ranks, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    assert [r["result"] for r in results] == [expected] * gather_rank.WORLD
    assert [r["unaudited"] for r in results] == [[0, 1]] * gather_rank.WORLD
    (gathers,) = {r["gathers"] for r in results}  # every rank called as often: they agreed each time
    assert [(r.slot, r.phase, r.collectives) for r in slots(path)] == [
        (0, Phase.LOCAL, gathers), (1, Phase.LOCAL, gathers)]
