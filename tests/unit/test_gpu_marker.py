"""The `gpu` marker (tests/conftest.py): where no GPU is visible, every test carrying it is collected and skipped
with a reason naming what is missing; nothing else is skipped. Checked by hiding the devices from a pytest run
of the GPU kernel tests, so it holds on a machine with a GPU too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_TESTS = "tests/unit/test_indexer_kernels_gpu.py"


def test_gpu_tests_are_collected_and_skipped_with_the_reason_when_no_gpu_is_visible() -> None:
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                GPU_TESTS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    count = int(re.search(r"(\d+) tests? collected", collected.stdout).group(1))
    assert count >= 20, collected.stdout[-2000:]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", GPU_TESTS],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert re.search(rf"\b{count} skipped\b", proc.stdout) and " passed" not in proc.stdout, proc.stdout[-3000:]
    reasons = {line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("SKIPPED")}
    assert len(reasons) == 1, reasons
    reason = reasons.pop()
    assert reason.startswith(f"needs an NVIDIA GPU: torch {_torch_version()} (")
    assert reason.endswith("sees no CUDA device (CUDA_VISIBLE_DEVICES is empty)")


def _torch_version() -> str:
    import torch

    return torch.__version__
