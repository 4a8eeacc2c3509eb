"""The indexer kernels on a CPU against the fp32 reference in the same process, so a regression in either shows.

On a CPU the Triton kernels run in Triton's interpreter (one numpy program per grid cell), so their time is
no guide to a GPU's; what this tracks is the ratio to `pdfleet.kernels.reference` on the same inputs, at a few
small paged (decode) and ragged (prefill) shapes, and the same ratio for the FP8 emulation of upstream's pages
(`pdfleet.kernels.fp8`, plain torch). A change that makes a kernel's grid or the emulation do more work moves its
ratio. Both sides run on one thread. Each figure is the best of several calls (on a shared machine, the call
least disturbed by other work; the interpreter's figures still wander by up to 3x between runs there). Nothing
about time is asserted; the run fails only if an output disagrees with the reference (masks, and values within
rtol 2e-4 / atol 1e-4 for the kernels, calc_diff < 1e-3 for FP8). About 30 s on 2 cores.

Each section is a function from the parsed arguments to printed rows, listed in SECTIONS; a new row family
(say, KV memory of bf16 vs FP8 keys at long context) is a new function added there.

    python benchmarks/bench_indexer.py [--repeats R]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from indexer_support import PagedBatch, RaggedBatch, best_seconds, causal_prefill, full_decode

from pdfleet.kernels import compare, fp8, paged_logits, ragged_logits, reference

CPU = torch.device("cpu")
RTOL, ATOL = 2e-4, 1e-4
FP8_DIFF = 1e-3
# (batch, context, heads, dim, next_n): a context ending inside a page, next_n > 1, upstream's 64 x 128 heads.
PAGED_SHAPES = ((4, 200, 16, 64, 1), (2, 256, 64, 128, 2), (1, 1024, 64, 128, 1))
# (tokens, heads, dim): causal prompts.
RAGGED_SHAPES = ((64, 16, 64), (128, 64, 128))


@dataclass(frozen=True)
class Ratio:
    name: str
    seconds: float
    baseline_seconds: float
    agrees: bool
    detail: str

    def line(self, what: str) -> str:
        verdict = "" if self.agrees else f"  DISAGREES with the reference: {self.detail}"
        return (f"{self.name}: {what} {self.seconds * 1e3:.1f} ms, reference {self.baseline_seconds * 1e3:.1f} ms: "
                f"{self.seconds / self.baseline_seconds:.2f}x the reference{verdict}")


def paged_batches() -> list[tuple[str, PagedBatch]]:
    return [(f"paged B={b} L={context} H={heads} D={dim} next_n={next_n}",
             full_decode(b, context, heads, dim, next_n, CPU, seed=n))
            for n, (b, context, heads, dim, next_n) in enumerate(PAGED_SHAPES)]


def ragged_batches() -> list[tuple[str, RaggedBatch]]:
    return [(f"ragged causal T={tokens} H={heads} D={dim}", causal_prefill(tokens, heads, dim, CPU, seed=n))
            for n, (tokens, heads, dim) in enumerate(RAGGED_SHAPES)]


def close(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, str]:
    finite = torch.isfinite(want)
    if not compare.same_masks(got, want):
        return False, "-inf masks differ"
    if not torch.allclose(got[finite], want[finite], rtol=RTOL, atol=ATOL):
        return False, f"max |error| {float((got[finite] - want[finite]).abs().max()):.3g}"
    return True, ""


def fp8_close(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, str]:
    diff = compare.calc_diff(got, want)
    if not compare.same_masks(got, want):
        return False, "-inf masks differ"
    return diff < FP8_DIFF, f"calc_diff {diff:.2e}"


def ratio(name: str, call: Callable[[], torch.Tensor], baseline: Callable[[], torch.Tensor],
          agree: Callable[[torch.Tensor, torch.Tensor], tuple[bool, str]], repeats: int) -> Ratio:
    agrees, detail = agree(call(), baseline())
    return Ratio(name, best_seconds(call, CPU, repeats), best_seconds(baseline, CPU, repeats), agrees, detail)


def kernels_vs_reference(args: argparse.Namespace) -> list[str]:
    """paged_logits and ragged_logits, interpreted, against the fp32 reference."""
    lines = []
    for name, paged in paged_batches():
        row = ratio(name, lambda paged=paged: paged_logits(*paged.args(), next_n=paged.next_n),
                    lambda paged=paged: reference.paged_logits(*paged.args(), next_n=paged.next_n), close,
                    args.repeats)
        lines.append(row.line("kernel (interpreted)"))
    for name, ragged in ragged_batches():
        row = ratio(name, lambda ragged=ragged: ragged_logits(*ragged.args()),
                    lambda ragged=ragged: reference.ragged_logits(*ragged.args()), close, args.repeats)
        lines.append(row.line("kernel (interpreted)"))
    return lines


def fp8_vs_reference(args: argparse.Namespace) -> list[str]:
    """The FP8 emulation (pages packed once, as stored; unpacking and query quantisation timed) against fp32."""
    lines = []
    for name, paged in paged_batches():
        if paged.q.shape[-1] != fp8.BLOCK:  # upstream's layout carries one scale per 128-element key
            continue
        packed = fp8.pack_pages(paged.k_cache)
        row = ratio(name, lambda paged=paged, packed=packed: fp8.paged_logits(
                        paged.q, packed, paged.weights, paged.context_lens, paged.block_tables, paged.next_n),
                    lambda paged=paged: reference.paged_logits(*paged.args(), next_n=paged.next_n), fp8_close,
                    args.repeats)
        lines.append(row.line("FP8 emulation"))
    for name, ragged in ragged_batches():
        row = ratio(name, lambda ragged=ragged: fp8.ragged_logits(*ragged.args()),
                    lambda ragged=ragged: reference.ragged_logits(*ragged.args()), fp8_close, args.repeats)
        lines.append(row.line("FP8 emulation"))
    return lines


SECTIONS: tuple[tuple[str, Callable[[argparse.Namespace], list[str]]], ...] = (
    ("Triton kernels (interpreted) vs the fp32 reference", kernels_vs_reference),
    ("FP8 emulation vs the fp32 reference", fp8_vs_reference),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    # One thread, as the interpreter's numpy runs: the ratio then compares work, not thread counts; and on a loaded
    # 2-core machine torch's second thread made these small calls ~50x slower (spinning for a busy core).
    torch.set_num_threads(1)
    disagreements = 0
    for title, section in SECTIONS:
        print(f"-- {title}", flush=True)
        for line in section(args):
            print(line, flush=True)
            disagreements += "DISAGREES" in line
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
