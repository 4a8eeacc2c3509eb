"""What the indexer kernel tests share, on a CPU (Triton's interpreter) and on a GPU: the acceptance asserts,
random paged and ragged inputs, and the edge cases both run.

Acceptance: logits within rtol 2e-4 / atol 1e-4 of the fp32 reference, -inf masks exact, top-k sets equal up to
ties (recall >= 0.99) with exact -1 padding.
"""

from __future__ import annotations

import zlib

import torch

from pdfleet.kernels import compare, reference, topk_indices

RTOL, ATOL = 2e-4, 1e-4

PAGED_CASES = {
    # name: (next_n, heads, dim, context_lens, max_pages)
    "one-token": (1, 16, 32, [1], 1),
    "partial-last-page": (1, 8, 64, [100, 64, 65], 2),
    "next-n-2": (2, 8, 32, [130, 2, 1], 3),
    "next-n-3-odd-heads": (3, 6, 48, [200, 7], 4),
    "empty-sequence": (1, 16, 32, [0, 90], 2),
    "upstream-heads": (1, 64, 128, [150], 3),
}

RAGGED_CASES = {
    # name: (tokens, keys, heads, dim, pattern)
    "causal-prefill": (37, 37, 16, 32, "causal"),
    "two-sequences": (20, 45, 8, 64, "packed"),
    "one-token": (1, 1, 16, 16, "causal"),
    "empty-rows": (12, 80, 8, 32, "random-with-empty"),
    "odd-heads-and-dim": (9, 70, 5, 40, "random-with-empty"),
    "upstream-heads": (6, 130, 64, 128, "causal-tail"),
}


def seed(case: str) -> int:
    """The same for a case in every run (str's hash changes with each process)."""
    return zlib.crc32(case.encode())


def assert_logits_match(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == torch.float32
    assert compare.same_masks(got, want), "the -inf masks differ"
    assert not torch.isnan(got).any()
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=RTOL, atol=ATOL)


def assert_topk_match(got_logits: torch.Tensor, want_logits: torch.Tensor, k: int) -> None:
    got, want = topk_indices(got_logits, k), topk_indices(want_logits, k)
    assert torch.equal((got < 0).sum(dim=1), (want < 0).sum(dim=1)), "-1 padding differs"
    assert compare.topk_recall(got, want_logits, k, ATOL) >= 0.99


def random_paged(batch: int, next_n: int, heads: int, dim: int, context_lens: list[int], max_pages: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """(q, k_cache, weights, context_lens, block_tables) on the CPU."""
    pool_pages = batch * max_pages + 3
    k_cache = torch.randn(pool_pages, reference.PAGE_SIZE, dim, generator=generator).bfloat16()
    # Each sequence gets distinct, shuffled physical pages; slots past its context hold junk the kernel must skip.
    tables = torch.randperm(pool_pages, generator=generator)[:batch * max_pages].view(batch, max_pages)
    q = torch.randn(batch * next_n, heads, dim, generator=generator).bfloat16()
    weights = torch.randn(batch * next_n, heads, generator=generator)
    return q, k_cache, weights, torch.tensor(context_lens, dtype=torch.int32), tables.to(torch.int32)


def paged_case(case: str) -> tuple[int, tuple[torch.Tensor, ...]]:
    """(next_n, inputs) of one of PAGED_CASES, seeded by its name."""
    next_n, heads, dim, context_lens, max_pages = PAGED_CASES[case]
    g = torch.Generator().manual_seed(seed(case))
    return next_n, random_paged(len(context_lens), next_n, heads, dim, context_lens, max_pages, g)


def ragged_ranges(tokens: int, keys: int, pattern: str, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if pattern == "causal":
        return torch.zeros(tokens, dtype=torch.int32), torch.arange(1, tokens + 1, dtype=torch.int32)
    if pattern == "causal-tail":  # the last tokens of a longer prompt
        return torch.zeros(tokens, dtype=torch.int32), torch.arange(keys - tokens + 1, keys + 1, dtype=torch.int32)
    if pattern == "packed":  # two prompts packed in one batch: the second's keys start after the first's
        first = tokens // 2
        starts = torch.tensor([0] * first + [25] * (tokens - first), dtype=torch.int32)
        ends = torch.cat([torch.arange(1, first + 1), torch.arange(26, 26 + tokens - first)]).to(torch.int32)
        return starts, ends
    starts = torch.randint(0, keys, (tokens,), generator=g, dtype=torch.int32)
    ends = torch.minimum(starts + torch.randint(0, keys, (tokens,), generator=g, dtype=torch.int32),
                         torch.tensor(keys, dtype=torch.int32))
    ends[::4] = starts[::4]  # every fourth row sees nothing
    return starts, ends


def ragged_case(case: str) -> tuple[torch.Tensor, ...]:
    """(q, k, weights, starts, ends) of one of RAGGED_CASES on the CPU, seeded by its name."""
    tokens, keys, heads, dim, pattern = RAGGED_CASES[case]
    g = torch.Generator().manual_seed(seed(case))
    q = torch.randn(tokens, heads, dim, generator=g).bfloat16()
    k = torch.randn(keys, dim, generator=g).bfloat16()
    weights = torch.randn(tokens, heads, generator=g)
    return (q, k, weights, *ragged_ranges(tokens, keys, pattern, g))
