"""`make bench`'s indexer row (benchmarks/bench_indexer.py), once with one repeat: every shape prints a ratio
against the reference for the kernels and for the FP8 emulation, and every output agrees with the reference.
Its times are not judged (a shared machine)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support import requires

ROOT = Path(__file__).resolve().parents[2]
RATIO = re.compile(r"^(paged|ragged) .+: (kernel \(interpreted\)|FP8 emulation) [\d.]+ ms, reference [\d.]+ ms: "
                   r"[\d.]+x the reference$")


def test_every_shape_prints_a_ratio_and_agrees_with_the_reference() -> None:
    requires.installed("triton")
    proc = subprocess.run([sys.executable, "benchmarks/bench_indexer.py", "--repeats", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    sections = [n for n, line in enumerate(lines) if line.startswith("-- ")]
    assert len(sections) == 2, lines
    kernels, emulation = lines[sections[0] + 1:sections[1]], lines[sections[1] + 1:]
    assert len(kernels) == 5 and all(RATIO.match(line) and "kernel" in line for line in kernels), kernels
    # FP8 rows only where D is 128, upstream's one scale per key.
    assert len(emulation) == 4 and all(RATIO.match(line) and "FP8" in line for line in emulation), emulation
