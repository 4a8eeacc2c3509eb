"""Running code of a published SGLang release other than the main one, each in its own subprocess.

`make sglang-releases` (a prerequisite of `make test`) installs each release of `RELEASES` with
hack/install-sglang-release.sh into `<cache>/sglang-VERSION`; a subprocess of .venv's python with that directory
first on PYTHONPATH imports the release's sglang and everything else from .venv.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest

RELEASES = ("0.5.6.post2", "0.5.7")  # keep in step with SGLANG_RELEASES in the Makefile
PROBE = pathlib.Path(__file__).with_name("detokenizer_probe.py")


def cache_dir() -> pathlib.Path:
    """Where hack/install-sglang-release.sh puts releases: $PDFLEET_CACHE, else $XDG_CACHE_HOME/pdfleet."""
    xdg = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(os.environ.get("PDFLEET_CACHE") or pathlib.Path(xdg) / "pdfleet")


def release_dir(version: str) -> pathlib.Path:
    """The release's install directory; fails the test, saying how to install it, when it is missing."""
    path = cache_dir() / f"sglang-{version}"
    if not (path / "sglang" / "srt" / "managers" / "detokenizer_manager.py").is_file():
        pytest.fail(f"SGLang {version} is not installed in {path}: `make test` installs it (or run "
                    f"`make sglang-releases`, which runs hack/install-sglang-release.sh {version})", pytrace=False)
    return path


def start_probe(version: str | None, spec: Mapping[str, Any]) -> subprocess.Popen[str]:
    """Starts the detokenizer probe on release `version` (None: the main install in .venv)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if version is not None:
        env["PYTHONPATH"] = str(release_dir(version))
    payload = json.dumps(dict(spec) | {"kernel_stand_in": version is not None})
    args = [sys.executable, "-W", "ignore", str(PROBE), payload]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(process: subprocess.Popen[str], timeout: float = 300) -> dict[str, Any]:
    out, err = process.communicate(timeout=timeout)
    if process.returncode != 0:
        pytest.fail(f"the detokenizer probe failed (exit {process.returncode}):\n{err[-4000:]}", pytrace=False)
    return json.loads(out.strip().splitlines()[-1])
