"""The indexer's logits in plain PyTorch with fp32 accumulation: the definition every kernel is checked against.

For query token t with per-head queries q[t, h] and weights w[t, h], and key position s with the single shared
key k[s], the score is sum over h of w[t, h] * ReLU(q[t, h] . k[s]). The ReLU sits inside the head sum, so the
heads cannot be folded into one query; `folded_*` computes that shortcut anyway, because it is what SGLang's
SM120 fallbacks compute and the checks measure how far it is from the definition.

Shapes, shared with the Triton kernels:
- ragged (prefill): q [T, H, D], k [S, D], weights [T, H], starts/ends [T]: token t sees keys [starts[t], ends[t]).
- paged (decode): q [B * next_n, H, D] (row b * next_n + i is the i-th query of sequence b), k_cache
  [pages, PAGE_SIZE, D], weights [B * next_n, H], context_lens [B], block_tables [B, max_pages]. Row i of
  sequence b sees positions p <= context_lens[b] - next_n + i. The output has max_pages * PAGE_SIZE columns.
Positions a token does not see are -inf.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

PAGE_SIZE = 64
# Bounds the [rows, heads, keys] fp32 intermediate the reference materialises (the kernels never do).
_CHUNK_BYTES = 1 << 28

Scores = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def head_scores(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[T, H, D] x [S, D] x [T, H] -> [T, S]: sum_h w * ReLU(q . k), in fp32."""
    k = k.float()
    rows = max(1, _CHUNK_BYTES // max(1, q.shape[1] * k.shape[0] * 4))
    out = torch.empty(q.shape[0], k.shape[0], dtype=torch.float32, device=q.device)
    for lo in range(0, q.shape[0], rows):
        s = torch.einsum("thd,sd->ths", q[lo:lo + rows].float(), k).relu_()
        out[lo:lo + rows] = torch.einsum("ths,th->ts", s, weights[lo:lo + rows].float())
    return out


def folded_scores(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The shortcut: one effective query sum_h w * q per token, no ReLU. Not the indexer's score."""
    effective = torch.einsum("thd,th->td", q.float(), weights.float())
    return effective @ k.float().T


def ragged_mask(starts: torch.Tensor, ends: torch.Tensor, keys: int) -> torch.Tensor:
    position = torch.arange(keys, device=starts.device)
    return (position[None, :] >= starts[:, None]) & (position[None, :] < ends[:, None])


def ragged_logits(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, starts: torch.Tensor,
                  ends: torch.Tensor, scores: Scores = head_scores) -> torch.Tensor:
    logits = scores(q, k, weights)
    return logits.masked_fill_(~ragged_mask(starts, ends, k.shape[0]), float("-inf"))


def paged_keys(k_cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """The first `context_len` keys of one sequence, gathered through its block table ([context_len, D])."""
    pages = -(-context_len // PAGE_SIZE)
    cache = k_cache.reshape(k_cache.shape[0], PAGE_SIZE, -1)
    return cache[block_table[:pages].long()].reshape(pages * PAGE_SIZE, -1)[:context_len]


def paged_logits(q: torch.Tensor, k_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                 block_tables: torch.Tensor, next_n: int, scores: Scores = head_scores) -> torch.Tensor:
    batch = block_tables.shape[0]
    if q.shape[0] != batch * next_n:
        raise ValueError(f"q has {q.shape[0]} rows; {batch} sequences x next_n {next_n} need {batch * next_n}")
    width = block_tables.shape[1] * PAGE_SIZE
    out = torch.full((batch * next_n, width), float("-inf"), dtype=torch.float32, device=q.device)
    for b, context_len in enumerate(context_lens.tolist()):
        if context_len <= 0:
            continue
        rows = slice(b * next_n, (b + 1) * next_n)
        logits = scores(q[rows], paged_keys(k_cache, block_tables[b], context_len), weights[rows])
        visible = context_len - next_n + torch.arange(next_n, device=q.device)
        position = torch.arange(context_len, device=q.device)
        out[rows, :context_len] = logits.masked_fill_(position[None, :] > visible[:, None], float("-inf"))
    return out
