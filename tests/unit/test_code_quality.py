"""The codebase stays ruff-clean and keeps its declared layers (.importlinter); CI runs both here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert path, f"{name} is not installed: run `make venv` (it comes with the dev extra)"
    return str(path)


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-6000:]


def test_import_layers_hold() -> None:
    result = subprocess.run([tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
