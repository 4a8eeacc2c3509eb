"""Without an importable SGLang, `pdfleet-engine` says so in one line and how to fix it, instead of a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pdfleet.runtime.instrument import rank_seams


def engine_hiding(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`pdfleet-engine args` in a Python where importing `module` fails as if it were not installed."""
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from pdfleet.runtime.launcher import main\n"
            f"sys.exit(main({list(args)!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)


def test_without_sglang_the_engine_prints_one_line_naming_it_and_the_install_and_exits_2() -> None:
    result = engine_hiding("sglang", "--check", "--", "--model-path", "/m")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("pdfleet-engine: SGLang is not installed in ")
    assert sys.executable in line
    (version,) = rank_seams.FINGERPRINTS
    assert f"`pip install sglang=={version}`" in line
    assert result.stdout == ""


def test_an_sglang_missing_one_of_its_own_dependencies_is_named_too() -> None:
    try:
        import sglang.srt.server_args  # noqa: F401
    except ImportError:
        pytest.fail("sglang is not installed: run `make sglang` (hack/install-sglang.sh)", pytrace=False)
    result = engine_hiding("torch", "--check", "--", "--model-path", "/m")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("pdfleet-engine: SGLang does not import (")
    assert "torch" in line


def test_the_patch_catalogue_needs_no_sglang() -> None:
    result = engine_hiding("sglang", "patches")
    assert result.returncode == 0, result.stderr
    assert "kv-poll-lockstep" in result.stdout
