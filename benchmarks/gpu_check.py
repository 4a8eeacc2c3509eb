"""The indexer kernels on an NVIDIA GPU at serving shapes: correct against the fp32 definition, and how fast.

One run (under 5 minutes on one H200) measures, in order:
  copy     the device's copy bandwidth: dst.copy_(src) on a large buffer, bytes read + written, best of several;
  decode   B=64 sequences of 32768 tokens each (every page full, pages shuffled through the pool), 64 heads,
           D=128, next_n=1: pdfleet's paged_logits at several pages_per_program, the naive torch path in fp32 and
           in bf16 (SGLang's own torch fallback's form: gather the pages, bmm to every head's scores, ReLU,
           times the weights, sum over heads, mask), and the folded-heads shortcut (one query per token, no
           ReLU); each row gives its time, its bandwidth on the key bytes (B * L * D * 2) and that as a fraction
           of the copy bandwidth, and its speed against the naive bf16 path; then next_n=2;
  prefill  a causal prompt of 4096 tokens through ragged_logits beside the naive torch path (all heads' scores
           in memory) and SGLang's per-head fallback loop, in TFLOP/s of the scores a token can see.
Every kernel output is checked against `pdfleet.kernels.reference` (masks exact, rtol 2e-4 / atol 1e-4 on
finite entries, top-2048 recall >= 0.99); the folded shortcut's top-2048 recall is printed, not judged.
The acceptance line (decode >= 70% of the copy bandwidth and >= 7x the naive bf16 path) prints PASS or FAIL;
a missed speed target does not change the exit status, a failed check does.

Exit status: 0 every check passed, 1 a check failed, 2 nothing was run: no NVIDIA GPU, or torch's cuBLAS is the
CPU-only stub `make sglang` installs where no real one was found, or Triton cannot build its launcher (the line
says which, and what to install).
`--cpu-smoke` runs the same code at tiny shapes on the CPU (the kernels in Triton's interpreter) so that the
script cannot rot on machines without a GPU; its speeds mean nothing.

    python benchmarks/gpu_check.py [--json PATH]
    python benchmarks/gpu_check.py --cpu-smoke
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from indexer_support import PagedBatch, RaggedBatch, best_seconds, causal_prefill, full_decode

from pdfleet.kernels import compare, paged_logits, ragged_logits, reference, topk_indices

RTOL, ATOL = 2e-4, 1e-4
RECALL_FLOOR = 0.99
BANDWIDTH_TARGET = 0.70
NAIVE_TARGET = 7.0
NO_GPU = 2
CHECK_FAILED = 1


@dataclass(frozen=True)
class Shapes:
    batch: int
    context: int
    heads: int
    dim: int
    prefill_tokens: int
    pages_per_program: tuple[int, ...]
    top_k: int
    copy_bytes: int
    repeats: int
    calls: int


FULL = Shapes(batch=64, context=32768, heads=64, dim=128, prefill_tokens=4096, pages_per_program=(4, 8, 16, 32),
              top_k=2048, copy_bytes=1 << 31, repeats=5, calls=10)
# A context that ends inside a page and a top-k shorter than it, so the smoke run meets the masks and the padding.
SMOKE = Shapes(batch=2, context=200, heads=8, dim=32, prefill_tokens=40, pages_per_program=(1, 4), top_k=32,
               copy_bytes=1 << 24, repeats=2, calls=1)


@dataclass
class Row:
    section: str
    path: str
    seconds: float
    key_bytes: int = 0  # decode rows: the bandwidth basis
    flops: int = 0  # prefill rows: the TFLOP/s basis
    naive_bf16_seconds: float = 0.0
    copy_bytes_per_s: float = 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.key_bytes / self.seconds

    @property
    def of_copy(self) -> float:
        return self.bytes_per_s / self.copy_bytes_per_s

    @property
    def vs_naive_bf16(self) -> float:
        return self.naive_bf16_seconds / self.seconds

    def cells(self) -> list[str]:
        rate = (f"{self.bytes_per_s / 1e12:6.2f} TB/s  {self.of_copy:5.0%}" if self.key_bytes
                else f"{self.flops / self.seconds / 1e12:6.1f} TFLOP/s   ")
        return [self.path, f"{self.seconds * 1e6:10.1f} us", rate, f"{self.vs_naive_bf16:6.2f}x"]


def say(line: str) -> None:
    print(line, flush=True)


def stubbed_cublas(lib: Path | None = None, maps: str | None = None) -> list[str]:
    """The cuBLAS libraries this process loaded from the CPU-only stubs hack/install-sglang.sh builds into torch/lib
    where no real one was found (its marker file lists them); any matmul on a GPU would abort in them."""
    lib = lib or Path(torch.__file__).resolve().parent / "lib"
    marker = lib / "PDFLEET_CUDA_STUBS.txt"
    if not marker.exists():
        return []
    maps = Path("/proc/self/maps").read_text() if maps is None else maps
    stubs = {os.path.realpath(lib / name) for name in marker.read_text().split() if name.startswith("libcublas")}
    loaded = {line.split()[-1] for line in maps.splitlines() if len(line.split()) >= 6}
    return sorted(Path(path).name for path in stubs & loaded)


def stubs_paths(names: list[str]) -> list[str]:
    return [str(Path(torch.__file__).resolve().parent / "lib" / name) for name in names]


def cublas_requirement() -> str:
    """The CUDA toolkit torch declares, narrowed to its cuBLAS extra (e.g. cuda-toolkit[cublas]==13.0.3)."""
    for requirement in importlib.metadata.requires("torch") or []:
        if match := re.match(r"cuda-toolkit\[[^\]]*\]\s*([=<>!~][^;]*)", requirement):
            return f"cuda-toolkit[cublas]{match.group(1).strip()}"
    return "the cuBLAS build torch was made with"


def refusal(cpu_smoke: bool) -> str | None:
    if cpu_smoke:
        return None
    if not torch.cuda.is_available():
        return ("gpu-check needs an NVIDIA GPU (torch.cuda.is_available() is False here); "
                "to exercise the script on a CPU run: .venv/bin/python benchmarks/gpu_check.py --cpu-smoke")
    if stubs := stubbed_cublas():
        return (f"gpu-check: torch here loads pdfleet's CPU-only stub of {', '.join(stubs)} (hack/install-sglang.sh "
                f"builds it where no real one is installed), so any matmul would abort; install the real one "
                f"(.venv/bin/python -m pip install '{cublas_requirement()}'; torch's loader looks in nvidia/cu13/lib "
                f"before its own lib/), and if the stub still loads, delete {' and '.join(stubs_paths(stubs))}")
    if missing := triton_build_needs():
        return (f"gpu-check: Triton builds its CUDA launcher on first use and needs {' and '.join(missing)} "
                f"(e.g. apt-get install gcc python3-dev)")
    return None


def triton_build_needs() -> list[str]:
    """What Triton's launcher build (a C file compiled against Python's headers) lacks on this machine."""
    missing = []
    if not any(shutil.which(cc) for cc in (os.environ.get("CC") or "gcc", "clang")):
        missing.append("a C compiler (gcc or clang, or $CC)")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        missing.append(f"Python's headers (Python.h in {sysconfig.get_paths()['include']})")
    return missing


class Checks:
    """Kernel outputs against the fp32 reference; each prints one line, and the failures are kept."""

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self.failures: list[str] = []
        self.lines: list[dict[str, object]] = []

    def logits(self, name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        problems = []
        finite = torch.isfinite(want)
        masks_exact = got.shape == want.shape and compare.same_masks(got, want)
        if got.shape != want.shape or got.dtype != torch.float32:
            problems.append(f"shape/dtype {list(got.shape)} {got.dtype}, want {list(want.shape)} float32")
            worst = float("inf")
        else:
            if not masks_exact:
                problems.append("-inf masks differ")
            if torch.isnan(got).any():
                problems.append("NaN in the output")
            error = (got[finite] - want[finite]).abs()
            # Over 1 is outside rtol/atol (torch.isclose's measure).
            worst = float((error / (ATOL + RTOL * want[finite].abs())).max()) if error.numel() else 0.0
            if worst > 1:
                problems.append(f"logits outside rtol {RTOL}/atol {ATOL}")
        recall = padding = None
        if got.shape == want.shape:
            picked, wanted = topk_indices(got, self.top_k), topk_indices(want, self.top_k)
            padding = bool(torch.equal((picked < 0).sum(dim=1), (wanted < 0).sum(dim=1)))
            recall = compare.topk_recall(picked, want, self.top_k, ATOL)
            if not padding:
                problems.append("-1 padding differs")
            if recall < RECALL_FLOOR:
                problems.append(f"top-{self.top_k} recall {recall:.4f} < {RECALL_FLOOR}")
        verdict = "ok" if not problems else "FAILED: " + "; ".join(problems)
        say(f"check {name}: worst error {worst:.3f} of the tolerance, top-{self.top_k} recall "
            f"{'n/a' if recall is None else f'{recall:.4f}'}, masks {'exact' if masks_exact else 'DIFFER'}: {verdict}")
        self.lines.append({"name": name, "worst_of_tolerance": worst, "recall": recall, "padding_exact": padding,
                           "ok": not problems})
        self.failures += [f"{name}: {problem}" for problem in problems]


def hidden(batch: PagedBatch, width: int) -> torch.Tensor:
    """[B * next_n, width]: True where a decode row must not see the position (the reference's rule)."""
    device = batch.q.device
    step = torch.arange(batch.next_n, device=device).repeat(batch.block_tables.shape[0])
    visible = batch.context_lens.repeat_interleave(batch.next_n) - batch.next_n + step
    return torch.arange(width, device=device)[None, :] > visible[:, None]


def gathered_keys(batch: PagedBatch) -> torch.Tensor:
    sequences, pages = batch.block_tables.shape
    return batch.k_cache[batch.block_tables.long()].view(sequences, pages * reference.PAGE_SIZE, -1)


def naive_paged(batch: PagedBatch, dtype: torch.dtype) -> torch.Tensor:
    """As a plain torch implementation writes it, in the form of SGLang 0.5.23's own decode fallback
    (dsv4/indexer.py, fp8_paged_mqa_logits_torch) over keys of `dtype`: gather the pages, one bmm to every head's
    scores [B, L, heads], ReLU, times the fp32 weights (which promotes), sum over heads, mask."""
    sequences, heads, dim = batch.block_tables.shape[0], batch.q.shape[1], batch.q.shape[2]
    keys = gathered_keys(batch).to(dtype)
    q = batch.q.to(dtype).view(sequences, batch.next_n * heads, dim)
    scores = torch.relu(torch.bmm(keys, q.transpose(1, 2))).view(sequences, -1, batch.next_n, heads)
    scores = scores * batch.weights.view(sequences, 1, batch.next_n, heads)
    logits = scores.sum(dim=3).transpose(1, 2).reshape(sequences * batch.next_n, -1)
    return logits.masked_fill_(hidden(batch, logits.shape[1]), float("-inf"))


def folded_paged(batch: PagedBatch) -> torch.Tensor:
    """The shortcut: one effective bf16 query per token (sum_h w * q), one matrix-vector product, no ReLU."""
    sequences, dim = batch.block_tables.shape[0], batch.q.shape[2]
    effective = torch.einsum("rhd,rh->rd", batch.q.float(), batch.weights).bfloat16()
    logits = torch.einsum("bnd,bld->bnl", effective.view(sequences, batch.next_n, dim), gathered_keys(batch))
    logits = logits.float().view(sequences * batch.next_n, -1)
    return logits.masked_fill_(hidden(batch, logits.shape[1]), float("-inf"))


def naive_ragged(batch: RaggedBatch, dtype: torch.dtype) -> torch.Tensor:
    """Every head's scores [T, H, S] in memory at once, ReLU, weighted head sum, mask."""
    scores = torch.einsum("thd,sd->ths", batch.q.to(dtype), batch.k.to(dtype)).relu_()
    logits = torch.einsum("ths,th->ts", scores, batch.weights.to(dtype)).float()
    return logits.masked_fill_(~reference.ragged_mask(batch.starts, batch.ends, batch.k.shape[0]), float("-inf"))


def per_head_ragged(batch: RaggedBatch) -> torch.Tensor:
    """SGLang 0.5.23's own prefill fallback's form (dsa/utils.py, _fp8_mqa_logits_torch) over bf16 keys: one bf16
    [T, S] product per head, ReLU'd and added in fp32, so only one head's scores are in memory at a time."""
    logits = torch.zeros(batch.q.shape[0], batch.k.shape[0], device=batch.q.device)
    k_t = batch.k.bfloat16().t()
    for head in range(batch.q.shape[1]):
        logits.addcmul_(torch.relu(torch.mm(batch.q[:, head].bfloat16(), k_t).float()),
                        batch.weights[:, head:head + 1])
    return logits.masked_fill_(~reference.ragged_mask(batch.starts, batch.ends, batch.k.shape[0]), float("-inf"))


class Run:
    def __init__(self, shapes: Shapes, device: torch.device) -> None:
        self.shapes = shapes
        self.device = device
        self.checks = Checks(shapes.top_k)
        self.rows: list[Row] = []
        self.copy_bytes_per_s = 0.0
        self.folded_recall = 0.0

    def time(self, call: Callable[[], object]) -> float:
        return best_seconds(call, self.device, self.shapes.repeats, self.shapes.calls)

    def copy_bandwidth(self) -> None:
        n = self.shapes.copy_bytes
        src = torch.ones(n, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        seconds = self.time(lambda: dst.copy_(src))
        self.copy_bytes_per_s = 2 * n / seconds
        say(f"copy bandwidth: {n / 2**30:.2f} GiB buffer, read + written, best {seconds * 1e6:.1f} us: "
            f"{self.copy_bytes_per_s / 1e12:.2f} TB/s")

    def decode(self, next_n: int, sweep: tuple[int, ...]) -> int:
        """Checks and times paged_logits at each pages_per_program in `sweep`; returns the fastest one."""
        s = self.shapes
        section = f"decode B={s.batch} L={s.context} H={s.heads} D={s.dim} next_n={next_n}"
        say(f"{section}: building inputs and the fp32 reference")
        batch = full_decode(s.batch, s.context, s.heads, s.dim, next_n, self.device, seed=next_n)
        want = reference.paged_logits(*batch.args(), next_n=next_n)
        naive_bf16 = self.time(lambda: naive_paged(batch, torch.bfloat16))
        self.baselines(section, want, {"naive torch fp32": naive_paged(batch, torch.float32),
                                       "naive torch bf16": naive_paged(batch, torch.bfloat16)})
        timed: dict[int, float] = {}
        for per_program in sweep:
            self.checks.logits(f"{section} pages_per_program={per_program}",
                               paged_logits(*batch.args(), next_n=next_n, pages_per_program=per_program), want)
            timed[per_program] = self.time(
                lambda per_program=per_program: paged_logits(*batch.args(), next_n=next_n,
                                                             pages_per_program=per_program))
            self.add(section, f"pdfleet pages_per_program={per_program}", timed[per_program], batch, naive_bf16)
        fastest = min(timed, key=timed.__getitem__)
        if len(sweep) > 1:
            self.add(section, f"pdfleet best (pages_per_program={fastest})", timed[fastest], batch, naive_bf16)
        self.add(section, "naive torch fp32", self.time(lambda: naive_paged(batch, torch.float32)), batch, naive_bf16)
        self.add(section, "naive torch bf16", naive_bf16, batch, naive_bf16)
        if next_n == 1:
            self.add(section, "folded heads (bf16, not the score)", self.time(lambda: folded_paged(batch)), batch,
                     naive_bf16)
            self.folded_recall = compare.topk_recall(topk_indices(folded_paged(batch), s.top_k), want, s.top_k, ATOL)
            say(f"{section}: the folded-heads shortcut keeps {self.folded_recall:.4f} of the reference's "
                f"top-{s.top_k} (printed, not judged: it is not the indexer's score)")
        return fastest

    def prefill(self) -> None:
        s = self.shapes
        section = f"prefill causal T={s.prefill_tokens} H={s.heads} D={s.dim}"
        say(f"{section}: building inputs and the fp32 reference")
        batch = causal_prefill(s.prefill_tokens, s.heads, s.dim, self.device)
        want = reference.ragged_logits(*batch.args())
        self.checks.logits(section, ragged_logits(*batch.args()), want)
        self.baselines(section, want, {"naive torch bf16": naive_ragged(batch, torch.bfloat16),
                                       "torch per-head loop": per_head_ragged(batch)})
        naive_bf16 = self.time(lambda: naive_ragged(batch, torch.bfloat16))
        for path, seconds in (("pdfleet ragged_logits", self.time(lambda: ragged_logits(*batch.args()))),
                              ("naive torch fp32", self.time(lambda: naive_ragged(batch, torch.float32))),
                              ("naive torch bf16", naive_bf16),
                              ("torch per-head loop (SGLang fallback)", self.time(lambda: per_head_ragged(batch)))):
            self.rows.append(Row(section, path, seconds, flops=batch.useful_flops(), naive_bf16_seconds=naive_bf16))
            say(f"{section}: {path} {seconds * 1e6:.1f} us, "
                f"{batch.useful_flops() / seconds / 1e12:.2f} TFLOP/s of visible scores")

    def baselines(self, section: str, want: torch.Tensor, outputs: dict[str, torch.Tensor]) -> None:
        """What the torch baselines compute, against the reference: they must be the same score for their times to
        compare (the bf16 ones round each head's scores to bf16, so they are close, not equal)."""
        for path, got in outputs.items():
            say(f"{section}: {path} computes the score to calc_diff {compare.calc_diff(got, want):.2e}, masks "
                f"{'exact' if compare.same_masks(got, want) else 'DIFFER'} (printed, not judged)")

    def add(self, section: str, path: str, seconds: float, batch: PagedBatch, naive_bf16: float) -> None:
        row = Row(section, path, seconds, key_bytes=batch.key_bytes(), naive_bf16_seconds=naive_bf16,
                  copy_bytes_per_s=self.copy_bytes_per_s)
        self.rows.append(row)
        say(f"{section}: {path} {seconds * 1e6:.1f} us, keys at {row.bytes_per_s / 1e12:.2f} TB/s "
            f"({row.of_copy:.0%} of copy), {row.vs_naive_bf16:.2f}x the naive bf16 path")


def table(rows: list[Row]) -> list[str]:
    lines, section = [], ""
    header = ["path", "time", "rate  of copy", "vs naive bf16"]
    widths = [44, 13, 22, 13]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        if row.section != section:
            section = row.section
            lines.append(section)
        lines.append("  ".join(c.ljust(w) for c, w in zip(["  " + row.cells()[0], *row.cells()[1:]], widths,
                                                             strict=True)))
    return lines


def acceptance(best: Row, smoke: bool) -> tuple[str, dict[str, object]]:
    bandwidth_ok = best.of_copy >= BANDWIDTH_TARGET
    naive_ok = best.vs_naive_bf16 >= NAIVE_TARGET
    figures = (f"{best.bytes_per_s / 1e12:.2f} TB/s = {best.of_copy:.0%} of copy (target >= {BANDWIDTH_TARGET:.0%}), "
               f"{best.vs_naive_bf16:.2f}x the naive bf16 path (target >= {NAIVE_TARGET:g}x)")
    if smoke:
        verdict = "not judged (--cpu-smoke: the interpreter's speed means nothing)"
    else:
        verdict = "PASS" if bandwidth_ok and naive_ok else "FAIL"
    summary = {"bandwidth_fraction": best.of_copy, "vs_naive_bf16": best.vs_naive_bf16,
               "bandwidth_ok": bandwidth_ok, "naive_ok": naive_ok, "verdict": verdict}
    return f"acceptance: paged decode ({best.path}) {figures}: {verdict}", summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU through Triton's interpreter")
    parser.add_argument("--json", type=Path, help="also write the figures and checks here")
    args = parser.parse_args(argv)
    if (reason := refusal(args.cpu_smoke)) is not None:
        print(reason, file=sys.stderr)
        return NO_GPU
    shapes, device = (SMOKE, torch.device("cpu")) if args.cpu_smoke else (FULL, torch.device("cuda"))
    name = "CPU (Triton interpreter)" if args.cpu_smoke else torch.cuda.get_device_name(device)
    # The reference is the fp32 definition: no TF32 in its matmuls.
    torch.set_float32_matmul_precision("highest")
    began = time.perf_counter()
    say(f"gpu-check on {name}: torch {torch.__version__}, shapes {asdict(shapes)}")
    run = Run(shapes, device)
    run.copy_bandwidth()
    fastest = run.decode(1, shapes.pages_per_program)
    best = next(row for row in run.rows if row.path.startswith("pdfleet best"))
    run.decode(2, (fastest,))
    run.prefill()
    say(f"== summary ({name}, copy {run.copy_bytes_per_s / 1e12:.2f} TB/s, {time.perf_counter() - began:.0f} s)")
    for line in table(run.rows):
        say(line)
    verdict_line, summary = acceptance(best, args.cpu_smoke)
    checks = (f"checks: {len(run.checks.lines)} run, all passed" if not run.checks.failures else
              f"checks: {len(run.checks.failures)} FAILED: " + " | ".join(run.checks.failures))
    say(checks)
    say(verdict_line)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "device": name, "smoke": args.cpu_smoke, "shapes": asdict(shapes),
            "copy_bytes_per_s": run.copy_bytes_per_s, "folded_recall": run.folded_recall,
            "rows": [asdict(row) for row in run.rows], "checks": run.checks.lines, "acceptance": summary,
        }, indent=2) + "\n")
    return CHECK_FAILED if run.checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
