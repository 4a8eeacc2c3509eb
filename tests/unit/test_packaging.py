"""The wheel carries every module under the `pdfleet` namespace, the runtime's bootstrap, and no top-level
`operator` package that would shadow the standard library."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = {"operator": "pdfleet/operator", "runtime": "pdfleet/runtime", "kernels": "pdfleet/kernels",
              "podrunner": "pdfleet/podrunner"}


def test_the_wheel_holds_every_module_under_pdfleet(tmp_path: Path) -> None:
    # Not -q: pip shows the build backend's warnings only when it is not quiet.
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    # Every install (`make venv`) would print screens of them: a deprecated pyproject field, an unlisted package.
    assert "Warning:" not in build.stdout + build.stderr, build.stdout + build.stderr
    wheel = next(tmp_path.glob("pdfleet-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"{prefix}/{path.relative_to(ROOT / folder)}" for folder, prefix in COMPONENTS.items()
                for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts}
    assert expected - names == set()
    assert "pdfleet/runtime/bootstrap/sitecustomize.py" in names
    assert not any(n.startswith(("operator/", "runtime/", "kernels/", "podrunner/")) for n in names)
