"""The engine launcher parses with SGLang's own parser and refuses bad patches before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdfleet.runtime.patches import base, catalogue
from tests.support import forkserver

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def cold_launcher(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m pdfleet.runtime.launcher`, a fresh interpreter, as an engine pod runs it."""
    return subprocess.run([sys.executable, "-m", "pdfleet.runtime.launcher", *args], capture_output=True,
                          text=True, timeout=180)


def launcher(*args: str) -> subprocess.CompletedProcess[str]:
    """The same command forked with SGLang already imported, as the local fleet's pod runner starts an engine:
    the answers are the launcher's either way, and a fresh import costs 10-20 s of CPU each."""
    return forkserver.run("pdfleet.runtime.launcher", *args, timeout=180)


@pytest.fixture(scope="module", autouse=True)
def real_sglang() -> None:
    try:
        import sglang  # noqa: F401
    except ImportError:
        pytest.fail("sglang is not installed: run `make sglang` (hack/install-sglang.sh)", pytrace=False)


def test_a_pd_decode_command_line_passes_the_checks() -> None:
    result = cold_launcher("--check", "--", "--model-path", "/models/x", "--tp-size", "8",
                      "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "fake")
    assert result.returncode == 0, result.stderr
    assert "SGLang 0.5.23" in result.stderr


def test_an_unknown_patch_is_refused_with_the_catalogue() -> None:
    result = launcher("--check", "--patch", "make-it-fast", "--", "--model-path", "/m")
    assert result.returncode == 2
    assert "unknown patch 'make-it-fast'" in result.stderr
    assert "kv-poll-lockstep" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_patch_marked_unavailable_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalogue, "UNAVAILABLE", {"bf16-index-keys": "its kernels are being verified"})
    with pytest.raises(base.PatchError, match="patch bf16-index-keys is not implemented by pdfleet yet: its kernels"):
        base.check(["bf16-index-keys"], "0.5.23")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_s_patches_pass_the_engine_checks(example: Path) -> None:
    patches = yaml.safe_load(example.read_text())["spec"]["engine"].get("patches", [])
    result = launcher("--check", *[f"--patch={p}" for p in patches], "--", "--model-path", "/m")
    assert result.returncode == 0, result.stderr
    assert all(p in result.stderr.splitlines()[-1] for p in patches)


@pytest.mark.parametrize("version", catalogue.INSTRUMENTED)
def test_the_recommended_set_every_default_pool_runs_passes_the_engine_checks(version: str) -> None:
    recommended = catalogue.recommended_for(version)
    assert recommended
    result = launcher("--check", *[f"--patch={p}" for p in recommended], "--", "--model-path", "/m")
    assert result.returncode == 0, result.stderr
    assert all(p in result.stderr.splitlines()[-1] for p in recommended)


def test_a_patch_fixed_upstream_is_refused() -> None:
    with pytest.raises(base.PatchError, match=r"fixed upstream in SGLang 0\.5\.8; this engine runs 0\.5\.23"):
        base.check(["dsml-batch-decode-guard"], "0.5.23")
    assert [p.id for p in base.check(["dsml-batch-decode-guard"], "0.5.7")] == ["dsml-batch-decode-guard"]


def test_sglang_rejects_an_unknown_flag_in_one_line() -> None:
    result = launcher("--check", "--", "--model-path", "/m", "--no-such-flag")
    assert result.returncode == 2
    assert result.stderr.strip() == "pdfleet-engine: SGLang refuses its arguments: unrecognized arguments: " \
                                    "--no-such-flag"


def test_the_catalogue_is_listed() -> None:
    result = launcher("patches")
    assert result.returncode == 0
    for pid in ("kv-poll-lockstep", "abort-consensus", "overlap-loop-report"):
        assert pid in result.stdout
