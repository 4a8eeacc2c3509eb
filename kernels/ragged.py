"""Prefill-time index logits over contiguous bf16 keys with a [start, end) key range per query token, fused.

One program owns a tile of query tokens (their heads stacked as the rows of one matrix, loaded once) and a run of
key tiles. It multiplies only the key tiles some token of its query tile can see (the union of their ranges,
computed on the host), loading them through a pipelined loop, and writes -inf over the rest of its run without
reading anything: the upper triangle of a causal prefill and other sequences' keys cost stores only. Runs of key
tiles split long contexts over several programs, so a short query chunk over a long prefix still fills the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdfleet.kernels.launch import SUM, Kernel, cast_to_fp32, logits_buffer, pow2

# Enough programs to keep every SM of a large GPU busy when the query tiles alone are few.
TARGET_PROGRAMS = 1024


def _ragged_logits_body(
    q_ptr, k_ptr, w_ptr, start_ptr, end_ptr, tile_lo_ptr, tile_hi_ptr, out_ptr,
    stride_q_row, stride_q_head, stride_k_row, stride_w_row, stride_out_row,
    tokens, keys, tiles_per_program,
    HEADS: tl.constexpr, DIM: tl.constexpr, HEADS_P2: tl.constexpr, DIM_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, CAST: tl.constexpr,
):
    tile_m = tl.program_id(0)
    key_tiles = (keys + BLOCK_N - 1) // BLOCK_N
    first = tl.program_id(1) * tiles_per_program
    last = tl.minimum(first + tiles_per_program, key_tiles)
    # The key tiles some token of this query tile sees, clamped to this program's run: [active, done).
    lo = tl.load(tile_lo_ptr + tile_m)
    hi = tl.load(tile_hi_ptr + tile_m)
    active = tl.minimum(tl.maximum(lo // BLOCK_N, first), last)
    done = tl.minimum(tl.maximum((hi + BLOCK_N - 1) // BLOCK_N, active), last)

    token = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    live_token = token < tokens
    column = tl.arange(0, BLOCK_N)
    out_rows = out_ptr + token[:, None].to(tl.int64) * stride_out_row
    minus_inf = tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32)
    for tile in range(first, active):
        position = tile * BLOCK_N + column
        tl.store(out_rows + position[None, :], minus_inf, mask=live_token[:, None] & (position < keys)[None, :])
    for tile in range(done, last):
        position = tile * BLOCK_N + column
        tl.store(out_rows + position[None, :], minus_inf, mask=live_token[:, None] & (position < keys)[None, :])

    stacked = tl.arange(0, BLOCK_M * HEADS_P2)
    row = tile_m * BLOCK_M + stacked // HEADS_P2
    head = stacked % HEADS_P2
    live_row = (row < tokens) & (head < HEADS)
    dim = tl.arange(0, DIM_P2)
    live_dim = dim < DIM
    q = tl.load(q_ptr + row[:, None].to(tl.int64) * stride_q_row + head[:, None] * stride_q_head + dim[None, :],
                mask=live_row[:, None] & live_dim[None, :], other=0.0)
    if CAST:
        q = q.to(tl.float32)
    w = tl.load(w_ptr + row.to(tl.int64) * stride_w_row + head, mask=live_row, other=0.0).to(tl.float32)
    start = tl.load(start_ptr + token, mask=live_token, other=0)
    end = tl.load(end_ptr + token, mask=live_token, other=0)
    for tile in tl.range(active, done, num_stages=NUM_STAGES):
        position = tile * BLOCK_N + column
        k = tl.load(k_ptr + position[:, None].to(tl.int64) * stride_k_row + dim[None, :],
                    mask=(position < keys)[:, None] & live_dim[None, :], other=0.0)
        if CAST:
            k = k.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        scores = tl.maximum(scores, 0.0) * w[:, None]
        logits = tl.reduce(tl.reshape(scores, (BLOCK_M, HEADS_P2, BLOCK_N)), 1, SUM)
        inside = (position[None, :] >= start[:, None]) & (position[None, :] < end[:, None])
        tl.store(out_rows + position[None, :], tl.where(inside, logits, float("-inf")),
                 mask=live_token[:, None] & (position < keys)[None, :])


_KERNEL = Kernel(_ragged_logits_body)


def ragged_logits(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, starts: torch.Tensor,
                  ends: torch.Tensor, block_m: int = 4, block_n: int = 64, num_stages: int = 3) -> torch.Tensor:
    """fp32 logits [T, S]: token t sees keys [starts[t], ends[t]) (shapes as in `pdfleet.kernels.reference`), a
    view whose rows are padded to 256 columns as DeepGEMM's are."""
    tokens, heads, dim = q.shape
    keys = k.shape[0]
    if weights.shape != (tokens, heads):
        raise ValueError(f"weights must be [{tokens}, {heads}], got {list(weights.shape)}")
    if k.shape[-1] != dim or starts.shape != (tokens,) or ends.shape != (tokens,):
        raise ValueError(f"k must be [S, {dim}] and starts, ends [{tokens}]; got {list(k.shape)}, "
                         f"{list(starts.shape)}, {list(ends.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or weights.stride(-1) != 1:
        raise ValueError("q, k and weights must be contiguous in their last dimension")
    out = logits_buffer(tokens, keys, q.device)
    if tokens == 0 or keys == 0:
        return out
    starts, ends = starts.to(torch.int32), ends.to(torch.int32)
    tiles = triton.cdiv(tokens, block_m)
    pad = tiles * block_m - tokens
    # Per query tile, the smallest start and largest end of its non-empty ranges (an empty tile: lo = keys, hi = 0).
    empty = ends <= starts
    lo = torch.nn.functional.pad(starts.masked_fill(empty, keys), (0, pad), value=keys).view(tiles, block_m)
    hi = torch.nn.functional.pad(ends.masked_fill(empty, 0), (0, pad), value=0).view(tiles, block_m)
    tile_lo, tile_hi = lo.amin(dim=1).contiguous(), hi.amax(dim=1).contiguous()
    key_tiles = triton.cdiv(keys, block_n)
    splits = max(1, min(key_tiles, triton.cdiv(TARGET_PROGRAMS, tiles)))
    per_program = triton.cdiv(key_tiles, splits)
    grid = (tiles, triton.cdiv(key_tiles, per_program))
    _KERNEL.on(q.device)[grid](
        q, k, weights, starts, ends, tile_lo, tile_hi, out,
        q.stride(0), q.stride(1), k.stride(0), weights.stride(0), out.stride(0),
        tokens, keys, per_program,
        HEADS=heads, DIM=dim, HEADS_P2=pow2(heads, 16), DIM_P2=pow2(dim, 16),
        BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=num_stages, CAST=cast_to_fp32(q, k),
        # A tile of 4 tokens x 64 heads is a 256-row dot whose fp32 result alone fills 4 warps' registers.
        num_warps=8 if block_m * pow2(heads, 16) >= 256 else 4,
    )
    return out
