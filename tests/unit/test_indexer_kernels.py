"""pdfleet's indexer kernels, run by Triton's interpreter on CPU, against the fp32 definition.

Acceptance: logits within rtol 2e-4 / atol 1e-4 of the reference, -inf masks exact, top-k sets equal up to ties
(recall >= 0.99) with exact -1 padding, on random shapes and the edges (one token, empty rows, a context shorter
than top-k, next_n > 1, a partially filled last page, heads and dims that are not powers of two).
"""

from __future__ import annotations

import pytest

from tests.support import requires

requires.installed("torch")
requires.installed("triton")

import torch  # noqa: E402

from pdfleet.kernels import compare, paged_logits, ragged_logits, reference, topk_indices  # noqa: E402

RTOL, ATOL = 2e-4, 1e-4


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
    pool_pages = batch * max_pages + 3
    k_cache = torch.randn(pool_pages, reference.PAGE_SIZE, dim, generator=generator).bfloat16()
    # Each sequence gets distinct, shuffled physical pages; slots past its context hold junk the kernel must skip.
    tables = torch.randperm(pool_pages, generator=generator)[:batch * max_pages].view(batch, max_pages)
    q = torch.randn(batch * next_n, heads, dim, generator=generator).bfloat16()
    weights = torch.randn(batch * next_n, heads, generator=generator)
    return q, k_cache, weights, torch.tensor(context_lens, dtype=torch.int32), tables.to(torch.int32)


PAGED_CASES = {
    # name: (next_n, heads, dim, context_lens, max_pages)
    "one-token": (1, 16, 32, [1], 1),
    "partial-last-page": (1, 8, 64, [100, 64, 65], 2),
    "next-n-2": (2, 8, 32, [130, 2, 1], 3),
    "next-n-3-odd-heads": (3, 6, 48, [200, 7], 4),
    "empty-sequence": (1, 16, 32, [0, 90], 2),
    "upstream-heads": (1, 64, 128, [150], 3),
}


@pytest.mark.parametrize("case", PAGED_CASES)
def test_paged_logits_match_the_fp32_reference(case: str) -> None:
    next_n, heads, dim, context_lens, max_pages = PAGED_CASES[case]
    g = torch.Generator().manual_seed(hash(case) % 2**31)
    inputs = random_paged(len(context_lens), next_n, heads, dim, context_lens, max_pages, g)
    got = paged_logits(*inputs, next_n=next_n)
    want = reference.paged_logits(*inputs, next_n=next_n)
    assert_logits_match(got, want)
    for k in (1, 16, 2048):  # 2048 is longer than every context here: rows end in -1
        assert_topk_match(got, want, k)


def test_paged_rows_see_only_their_causal_prefix() -> None:
    g = torch.Generator().manual_seed(1)
    q, k_cache, weights, context_lens, tables = random_paged(1, 3, 4, 16, [70], 2, g)
    got = paged_logits(q, k_cache, weights, context_lens, tables, next_n=3)
    # next_n = 3 queries at positions 67, 68, 69 of a 70-token context: each sees itself and what precedes it.
    assert [int(torch.isfinite(row).sum()) for row in got] == [68, 69, 70]
    assert got.shape == (3, 128)


def test_paged_logits_accept_upstream_cache_shapes() -> None:
    g = torch.Generator().manual_seed(2)
    q, k_cache, weights, context_lens, tables = random_paged(2, 1, 8, 32, [90, 10], 2, g)
    want = paged_logits(q, k_cache, weights, context_lens, tables)
    for shaped in (k_cache.unsqueeze(2), k_cache.flatten(1)):  # [pages, 64, 1, D] and [pages, 64 * D]
        assert torch.equal(paged_logits(q, shaped, weights, context_lens, tables), want)


RAGGED_CASES = {
    # name: (tokens, keys, heads, dim, pattern)
    "causal-prefill": (37, 37, 16, 32, "causal"),
    "two-sequences": (20, 45, 8, 64, "packed"),
    "one-token": (1, 1, 16, 16, "causal"),
    "empty-rows": (12, 80, 8, 32, "random-with-empty"),
    "odd-heads-and-dim": (9, 70, 5, 40, "random-with-empty"),
    "upstream-heads": (6, 130, 64, 128, "causal-tail"),
}


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


@pytest.mark.parametrize("case", RAGGED_CASES)
def test_ragged_logits_match_the_fp32_reference(case: str) -> None:
    tokens, keys, heads, dim, pattern = RAGGED_CASES[case]
    g = torch.Generator().manual_seed(hash(case) % 2**31)
    q = torch.randn(tokens, heads, dim, generator=g).bfloat16()
    k = torch.randn(keys, dim, generator=g).bfloat16()
    weights = torch.randn(tokens, heads, generator=g)
    starts, ends = ragged_ranges(tokens, keys, pattern, g)
    got = ragged_logits(q, k, weights, starts, ends)
    want = reference.ragged_logits(q, k, weights, starts, ends)
    assert_logits_match(got, want)
    for k_top in (1, 8, 2048):
        assert_topk_match(got, want, k_top)


def test_ragged_empty_rows_are_all_minus_inf_and_select_nothing() -> None:
    g = torch.Generator().manual_seed(3)
    q, k, weights = torch.randn(4, 4, 16, generator=g), torch.randn(50, 16, generator=g), torch.ones(4, 4)
    starts = torch.tensor([0, 10, 10, 49], dtype=torch.int32)
    ends = torch.tensor([0, 10, 20, 50], dtype=torch.int32)
    got = ragged_logits(q, k, weights, starts, ends)
    assert torch.isneginf(got[:2]).all()
    assert torch.equal(topk_indices(got, 4)[:2], torch.full((2, 4), -1, dtype=torch.int32))
    assert int(torch.isfinite(got[2]).sum()) == 10 and int(torch.isfinite(got[3]).sum()) == 1


def test_fp32_inputs_give_the_same_logits_as_bf16_values() -> None:
    g = torch.Generator().manual_seed(4)
    q, k_cache, weights, context_lens, tables = random_paged(2, 1, 8, 32, [64, 33], 1, g)
    assert_logits_match(paged_logits(q.float(), k_cache.float(), weights, context_lens, tables),
                        paged_logits(q, k_cache, weights, context_lens, tables))


def test_bad_shapes_are_refused_with_the_shape_named() -> None:
    g = torch.Generator().manual_seed(5)
    q, k_cache, weights, context_lens, tables = random_paged(2, 1, 8, 32, [10, 10], 1, g)
    with pytest.raises(ValueError, match="next_n 2 need 4"):
        paged_logits(q, k_cache, weights, context_lens, tables, next_n=2)
    with pytest.raises(ValueError, match=r"weights must be \[2, 8\]"):
        paged_logits(q, k_cache, weights[:, :4], context_lens, tables)
    with pytest.raises(ValueError, match="starts, ends"):
        ragged_logits(q, k_cache[0], weights, torch.zeros(3), torch.ones(3))


def test_topk_pads_with_minus_one_and_never_picks_a_masked_position() -> None:
    logits = torch.tensor([[0.5, float("-inf"), 2.0], [float("-inf")] * 3])
    picked = topk_indices(logits, 5)
    assert picked.dtype == torch.int32 and picked.shape == (2, 5)
    assert sorted(picked[0].tolist()) == [-1, -1, -1, 0, 2]
    assert picked[1].tolist() == [-1] * 5
