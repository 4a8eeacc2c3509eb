"""The repository root never shadows the standard library: `operator/` is not an importable `operator`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_python_started_in_the_repository_root_gets_the_standard_librarys_operator() -> None:
    # -S: no site-packages, so no .pth file can import the real `operator` early and hide the problem.
    probe = "import operator, sys; print(operator.__file__); assert hasattr(operator, 'itemgetter')"
    result = subprocess.run([sys.executable, "-S", "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert not result.stdout.strip().startswith(str(ROOT))


def test_pip_runs_from_the_repository_root() -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "--version"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
