"""What the indexer benchmarks share (gpu_check.py, bench_indexer.py): their inputs and how they time a call.

A decode batch's pages are scattered through the pool in a random order, as a serving cache's are after a while,
so neither a kernel nor a baseline reads keys in one contiguous sweep.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pdfleet.kernels.reference import PAGE_SIZE


@dataclass(frozen=True)
class PagedBatch:
    q: torch.Tensor  # [batch * next_n, heads, dim] bf16
    k_cache: torch.Tensor  # [pages, PAGE_SIZE, dim] bf16
    weights: torch.Tensor  # [batch * next_n, heads] fp32
    context_lens: torch.Tensor  # [batch] int32
    block_tables: torch.Tensor  # [batch, max_pages] int32
    next_n: int

    def args(self) -> tuple[torch.Tensor, ...]:
        """The positional arguments of `paged_logits` (kernel and reference), next_n aside."""
        return self.q, self.k_cache, self.weights, self.context_lens, self.block_tables

    def key_bytes(self) -> int:
        """The bytes of the keys the batch's contexts cover: what a decode step must read at least once."""
        return int(self.context_lens.sum()) * self.k_cache.shape[-1] * self.k_cache.element_size()


@dataclass(frozen=True)
class RaggedBatch:
    q: torch.Tensor  # [tokens, heads, dim] bf16
    k: torch.Tensor  # [keys, dim] bf16
    weights: torch.Tensor  # [tokens, heads] fp32
    starts: torch.Tensor  # [tokens] int32
    ends: torch.Tensor  # [tokens] int32

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.k, self.weights, self.starts, self.ends

    def useful_flops(self) -> int:
        """2 * heads * dim per (token, visible key) pair: the work of the scores a token can see."""
        visible = int((self.ends - self.starts).clamp(min=0).sum())
        return 2 * self.q.shape[1] * self.q.shape[2] * visible


def full_decode(batch: int, context: int, heads: int, dim: int, next_n: int, device: torch.device,
                seed: int = 0) -> PagedBatch:
    """Every sequence `context` tokens long, its pages shuffled through a pool of exactly batch * pages."""
    g = torch.Generator(device=device).manual_seed(seed)
    pages = -(-context // PAGE_SIZE)

    def normal(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    tables = torch.randperm(batch * pages, generator=g, device=device).view(batch, pages).to(torch.int32)
    return PagedBatch(
        q=normal(batch * next_n, heads, dim), k_cache=normal(batch * pages, PAGE_SIZE, dim),
        weights=normal(batch * next_n, heads, dtype=torch.float32),
        context_lens=torch.full((batch,), context, dtype=torch.int32, device=device), block_tables=tables,
        next_n=next_n)


def causal_prefill(tokens: int, heads: int, dim: int, device: torch.device, seed: int = 0) -> RaggedBatch:
    """One prompt of `tokens` tokens: token t sees keys [0, t]."""
    g = torch.Generator(device=device).manual_seed(seed)
    return RaggedBatch(
        q=torch.randn(tokens, heads, dim, generator=g, device=device, dtype=torch.bfloat16),
        k=torch.randn(tokens, dim, generator=g, device=device, dtype=torch.bfloat16),
        weights=torch.randn(tokens, heads, generator=g, device=device),
        starts=torch.zeros(tokens, dtype=torch.int32, device=device),
        ends=torch.arange(1, tokens + 1, dtype=torch.int32, device=device))


def best_seconds(call: Callable[[], object], device: torch.device, repeats: int, calls: int = 1) -> float:
    """Seconds per call: the best of `repeats` runs of `calls` back-to-back calls, after one untimed call.

    The untimed call compiles a kernel on first use. On a GPU the runs are timed with CUDA events around calls
    queued back to back, so Python's launch cost overlaps the device's work as it does in a serving loop; on a
    CPU, with the wall clock. The best run is the one least disturbed by other work on the machine.
    """
    call()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                call()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            began = time.perf_counter()
            for _ in range(calls):
                call()
            elapsed = time.perf_counter() - began
        best = min(best, elapsed / calls)
    return best
