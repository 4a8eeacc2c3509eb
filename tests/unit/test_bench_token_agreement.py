"""`make bench`'s token-agreement row (benchmarks/bench_token_agreement.py), at TP 2 with few calls: SGLang's own
sampler sync leaves every rank with one token (each rank starts from its own) and a row per batch prints both
times and their ratio. Its times are not judged (a shared machine)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\s+2\s+(\d+)\s+[\d.]+ us \(p99\s+[\d.]+\)\s+[\d.]+ us \(p99\s+[\d.]+\)\s+[\d.]+x$")


def test_every_batch_prints_the_sync_beside_the_request_broadcast() -> None:
    proc = subprocess.run([sys.executable, "benchmarks/bench_token_agreement.py", "--tp", "2", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [m.group(1) for line in proc.stdout.splitlines() if (m := ROW.match(line))]
    assert rows == ["1", "64", "256"], proc.stdout
