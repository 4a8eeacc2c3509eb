"""`make gpu-check`'s script (benchmarks/gpu_check.py) on a CPU, so that it cannot rot between GPU runs.

--cpu-smoke runs every section at tiny shapes through Triton's interpreter and must pass its checks; a kernel
that computes something else must make it exit 1; without a GPU and without --cpu-smoke it refuses in one line.
Its speeds on a CPU mean nothing and are not judged.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import requires

requires.installed("torch")
requires.installed("triton")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
TIMEOUT_S = 300  # about 5 s alone; the interpreter on a loaded 2-core machine


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=env)


@pytest.fixture
def gpu_check(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # the script imports its sibling indexer_support
    return importlib.import_module("gpu_check")


def test_cpu_smoke_runs_every_section_and_passes_its_checks(tmp_path: Path) -> None:
    figures_path = tmp_path / "figures.json"
    proc = run_script("--cpu-smoke", "--json", str(figures_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    checks = [line for line in lines if line.startswith("check ")]
    # next_n=1 at both swept pages_per_program, next_n=2 at the faster, the causal prefill.
    assert len(checks) == 4 and all(line.endswith("masks exact: ok") for line in checks), checks
    assert any(line.startswith("copy bandwidth: ") and line.endswith("TB/s") for line in lines)
    assert any("folded-heads shortcut keeps" in line for line in lines)
    baselines = [line for line in lines if " computes the score to calc_diff " in line]
    assert len(baselines) == 6 and all("masks exact" in line for line in baselines), baselines
    summary = lines[lines.index(next(line for line in lines if line.startswith("== summary"))):]
    for path in ("pdfleet pages_per_program=1", "pdfleet best", "naive torch fp32", "naive torch bf16",
                 "folded heads", "pdfleet ragged_logits", "torch per-head loop"):
        assert any(line.strip().startswith(path) for line in summary), path
    assert summary[-2] == "checks: 4 run, all passed"
    assert summary[-1].startswith("acceptance: paged decode") and summary[-1].endswith("not judged "
                                                                                      "(--cpu-smoke: the "
                                                                                      "interpreter's speed means "
                                                                                      "nothing)")
    figures = json.loads(figures_path.read_text())
    assert figures["smoke"] is True and figures["copy_bytes_per_s"] > 0
    assert [c["ok"] for c in figures["checks"]] == [True] * 4
    assert {row["path"] for row in figures["rows"]} >= {"naive torch bf16", "pdfleet ragged_logits"}


def test_a_kernel_that_computes_something_else_fails_the_run(gpu_check: ModuleType,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    real = gpu_check.paged_logits

    def off_by_a_little(*args: object, **kwargs: object) -> torch.Tensor:
        out = real(*args, **kwargs)
        return out + 1e-2 * out[torch.isfinite(out)].abs().max()  # -inf stays -inf: only the values are wrong

    monkeypatch.setattr(gpu_check, "paged_logits", off_by_a_little)
    assert gpu_check.main(["--cpu-smoke"]) == gpu_check.CHECK_FAILED
    out = capsys.readouterr().out
    assert "logits outside rtol" in out and "checks: 3 FAILED" in out  # three paged checks; the prefill passed


def test_a_mask_that_differs_is_named(gpu_check: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    checks = gpu_check.Checks(top_k=4)
    want = torch.tensor([[1.0, 2.0, float("-inf")]])
    checks.logits("leaky", torch.tensor([[1.0, 2.0, 0.0]]), want)
    checks.logits("same", want.clone(), want)
    assert checks.failures == ["leaky: -inf masks differ", "leaky: -1 padding differs"]
    assert capsys.readouterr().out.splitlines()[1].endswith("masks exact: ok")


def test_without_a_gpu_it_refuses_in_one_line_naming_the_cpu_variant() -> None:
    # No visible device, so this refuses on a GPU machine too.
    proc = run_script(env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "needs an NVIDIA GPU" in proc.stderr and "gpu_check.py --cpu-smoke" in proc.stderr


def test_a_stubbed_cublas_is_named_with_the_real_one_to_install(gpu_check: ModuleType, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "PDFLEET_CUDA_STUBS.txt").write_text("libcublas.so.13\nlibcublasLt.so.13\nlibnccl.so.2\n")
    real = "/venv/site-packages/nvidia/cu13/lib/libcublasLt.so.13"
    maps = "\n".join(f"7f00-7f10 r-xp 00000000 08:01 1 {path}" for path in (tmp_path / "libcublas.so.13", real))
    assert gpu_check.stubbed_cublas(tmp_path, maps) == ["libcublas.so.13"]  # the Lt one loaded is the real one
    assert gpu_check.stubbed_cublas(tmp_path, f"7f00-7f10 r-xp 00000000 08:01 1 {real}") == []
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check, "stubbed_cublas", lambda: ["libcublas.so.13"])
    reason = gpu_check.refusal(cpu_smoke=False)
    assert reason is not None and "stub of libcublas.so.13" in reason
    assert re.search(r"pip install 'cuda-toolkit\[cublas\][=<>~!]=", reason), reason  # the pin torch declares


def test_the_bare_machine_variant_imports_the_kernels_without_pdfleet_installed(tmp_path: Path) -> None:
    # A machine with torch and Triton but no package index: the script's link tree must be all pdfleet needs.
    # `python -S` skips the site-packages .pth files, the editable install's among them; torch comes from
    # PYTHONPATH instead.
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the script would run the whole check, which `make gpu-check` covers")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    env = {**os.environ, "PYTHON": str(python), "PYTHONPATH": str(Path(torch.__file__).parents[1])}
    plain = subprocess.run([str(python), "-c", "import pdfleet.kernels"], env=env, capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    assert plain.returncode != 0 and "No module named 'pdfleet'" in plain.stderr, "pdfleet is still installed"
    done = subprocess.run([str(ROOT / "hack" / "gpu-check-bare.sh"), str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 2, done.stdout + done.stderr
    assert re.search(r"torch \S+, triton \S+, GPU: none visible", done.stdout), done.stdout
