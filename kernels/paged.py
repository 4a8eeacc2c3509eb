"""Decode-time index logits over a paged bf16 key cache, fused: scores never leave registers.

One program owns a run of pages of one sequence. It loads that sequence's queries (next_n tokens x heads,
stacked as the rows of one matrix) once, then for each page reads the 64 keys once, multiplies them against
every query row in one dot, applies the per-head ReLU and weights, sums over heads and writes one fp32 logit
per (query token, key). Pages past the context are written as -inf without reading anything.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdfleet.kernels.launch import SUM, Kernel, cast_to_fp32, logits_buffer, pow2
from pdfleet.kernels.reference import PAGE_SIZE


def _paged_logits_body(
    q_ptr, k_ptr, w_ptr, context_ptr, table_ptr, out_ptr,
    stride_q_row, stride_q_head, stride_k_page, stride_k_slot, stride_w_row, stride_table, stride_out_row,
    max_pages,
    HEADS: tl.constexpr, DIM: tl.constexpr, NEXT_N: tl.constexpr,
    HEADS_P2: tl.constexpr, DIM_P2: tl.constexpr, NEXT_N_P2: tl.constexpr,
    PAGE: tl.constexpr, PAGES_PER_PROGRAM: tl.constexpr, NUM_STAGES: tl.constexpr, CAST: tl.constexpr,
):
    sequence = tl.program_id(0)
    first_page = tl.program_id(1) * PAGES_PER_PROGRAM
    context = tl.load(context_ptr + sequence)

    stacked = tl.arange(0, NEXT_N_P2 * HEADS_P2)
    step, head = stacked // HEADS_P2, stacked % HEADS_P2
    live_row = (step < NEXT_N) & (head < HEADS)
    dim = tl.arange(0, DIM_P2)
    live_dim = dim < DIM
    row = sequence * NEXT_N + step
    q = tl.load(q_ptr + row[:, None] * stride_q_row + head[:, None] * stride_q_head + dim[None, :],
                mask=live_row[:, None] & live_dim[None, :], other=0.0)
    if CAST:
        q = q.to(tl.float32)
    w = tl.load(w_ptr + row * stride_w_row + head, mask=live_row, other=0.0).to(tl.float32)

    steps = tl.arange(0, NEXT_N_P2)
    out_rows = sequence * NEXT_N + steps
    visible = context - NEXT_N + steps
    slot = tl.arange(0, PAGE)
    pages_in_context = (context + PAGE - 1) // PAGE
    # Straight-line body (no branch on the context) so Triton can pipeline the page loads across iterations;
    # a page past the context loads nothing (masked) and its logits come out -inf like every invisible one.
    for offset in tl.range(0, PAGES_PER_PROGRAM, num_stages=NUM_STAGES):
        page = first_page + offset
        position = page * PAGE + slot
        physical = tl.load(table_ptr + sequence * stride_table + page, mask=page < pages_in_context, other=0)
        k = tl.load(k_ptr + physical.to(tl.int64) * stride_k_page + slot[:, None] * stride_k_slot + dim[None, :],
                    mask=(position < context)[:, None] & live_dim[None, :], other=0.0)
        if CAST:
            k = k.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        scores = tl.maximum(scores, 0.0) * w[:, None]
        logits = tl.reduce(tl.reshape(scores, (NEXT_N_P2, HEADS_P2, PAGE)), 1, SUM)
        logits = tl.where(position[None, :] <= visible[:, None], logits, float("-inf"))
        tl.store(out_ptr + out_rows[:, None] * stride_out_row + position[None, :], logits,
                 mask=(steps < NEXT_N)[:, None] & (position < max_pages * PAGE)[None, :])


_KERNEL = Kernel(_paged_logits_body)


def paged_logits(q: torch.Tensor, k_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                 block_tables: torch.Tensor, next_n: int = 1, pages_per_program: int = 8,
                 num_stages: int = 3) -> torch.Tensor:
    """fp32 logits [B * next_n, max_pages * 64] (shapes as in `pdfleet.kernels.reference`), a view whose rows
    are padded to 256 columns as DeepGEMM's are.

    k_cache may be [pages, 64, D], [pages, 64, 1, D] or [pages, 64 * D]; its rows must be contiguous.
    """
    rows, heads, dim = q.shape
    batch, max_pages = block_tables.shape
    if rows != batch * next_n:
        raise ValueError(f"q has {rows} rows; {batch} sequences x next_n {next_n} need {batch * next_n}")
    if weights.shape != (rows, heads):
        raise ValueError(f"weights must be [{rows}, {heads}], got {list(weights.shape)}")
    cache = k_cache.view(k_cache.shape[0], PAGE_SIZE, dim)
    if q.stride(-1) != 1 or cache.stride(-1) != 1 or weights.stride(-1) != 1:
        raise ValueError("q, k_cache and weights must be contiguous in their last dimension")
    out = logits_buffer(rows, max_pages * PAGE_SIZE, q.device)
    if rows == 0 or max_pages == 0:
        return out
    tables = block_tables.to(torch.int32)
    per_program = max(1, min(pages_per_program, max_pages))
    grid = (batch, triton.cdiv(max_pages, per_program))
    _KERNEL.on(q.device)[grid](
        q, cache, weights, context_lens.to(torch.int32), tables, out,
        q.stride(0), q.stride(1), cache.stride(0), cache.stride(1), weights.stride(0), tables.stride(0),
        out.stride(0),
        max_pages,
        HEADS=heads, DIM=dim, NEXT_N=next_n,
        HEADS_P2=pow2(heads, 16), DIM_P2=pow2(dim, 16), NEXT_N_P2=pow2(next_n),
        PAGE=PAGE_SIZE, PAGES_PER_PROGRAM=per_program, NUM_STAGES=num_stages, CAST=cast_to_fp32(q, cache),
    )
    return out
