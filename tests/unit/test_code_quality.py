"""The codebase stays ruff-clean and keeps its declared layers (.importlinter); CI runs both here."""

from __future__ import annotations

import configparser
import re
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


def test_every_operator_part_has_a_layer() -> None:
    """import-linter's `exhaustive` needs a container, and pdfleet.operator (a namespace package) is none in its
    graph: so here, every module and sub-package of operator/ must be named in the operator-layers contract."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    named = {part.strip().removeprefix("pdfleet.operator.")
             for line in config["importlinter:contract:operator-layers"]["layers"].split("\n") if line.strip()
             for part in re.split(r"[|:]", line)}
    operator = ROOT / "operator"
    parts = {p.stem for p in operator.glob("*.py")} | {p.name for p in operator.iterdir()
                                                      if p.is_dir() and any(p.glob("*.py"))}
    assert named == parts, f"no layer: {sorted(parts - named)}; named, not a part: {sorted(named - parts)}"
