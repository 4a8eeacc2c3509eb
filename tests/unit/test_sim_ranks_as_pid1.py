"""The engine simulator's rank processes live when the engine is its container's first process (pid 1 of its pid
namespace), as in a real container: they took a parent of pid 1 for an engine already gone and exited at once,
so on a real kubelet node the engine served /health while no rank ever entered the event loop. Run here in a pid
namespace of its own (`unshare`, root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r'''
import os, sys, time
from pdfleet.runtime.health import ledger
from pdfleet.runtime.simulator.config import Engine, Timing
from pdfleet.runtime.simulator.ranks import Control, RankGroup

assert os.getpid() == 1, os.getpid()
os.environ["PDFLEET_LEDGER_PATH"] = sys.argv[1]
engine = Engine("decode", True, 1, 2, 1, 0, "127.0.0.1", 0, 0, "m", "m", "fake")
group = RankGroup(engine, Timing(), Control(engine.local_ranks, None)).start()
deadline = time.monotonic() + 30
loops = []
while time.monotonic() < deadline:
    try:
        with ledger.Ledger.open_readonly(sys.argv[1]) as led:
            loops = [r.loop.value for r in led.read_all() if r.pid]
    except (FileNotFoundError, ledger.LedgerError):
        loops = []
    alive = [p.is_alive() for p in group.procs]
    if len(loops) == 2 and all(loops) and all(alive):
        print("ranks in", sorted(set(loops)))
        group.stop()
        sys.exit(0)
    if not all(alive):
        print("a rank exited:", [p.exitcode for p in group.procs])
        sys.exit(1)
    time.sleep(0.05)
print("ranks never in the loop:", loops)
sys.exit(1)
'''


def test_ranks_live_when_the_engine_is_pid_1(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.fail("needs root and unshare (util-linux) to make a pid namespace", pytrace=False)
    proc = subprocess.run([unshare, "--pid", "--fork", "--kill-child", sys.executable, "-c", SCRIPT,
                           str(tmp_path / "ledger")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks in" in proc.stdout
