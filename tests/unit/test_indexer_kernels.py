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

from pdfleet.kernels import paged_logits, ragged_logits, reference, topk_indices  # noqa: E402
from tests.support.indexer import (  # noqa: E402
    PAGED_CASES,
    RAGGED_CASES,
    assert_logits_match,
    assert_topk_match,
    paged_case,
    ragged_case,
    random_paged,
)


@pytest.mark.parametrize("case", PAGED_CASES)
def test_paged_logits_match_the_fp32_reference(case: str) -> None:
    next_n, inputs = paged_case(case)
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


@pytest.mark.parametrize("case", RAGGED_CASES)
def test_ragged_logits_match_the_fp32_reference(case: str) -> None:
    inputs = ragged_case(case)
    got = ragged_logits(*inputs)
    want = reference.ragged_logits(*inputs)
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


def test_logits_rows_are_padded_as_sglang_s_top_k_transform_requires() -> None:
    # SGLang's v2 top-k takes fp32 with unit column stride and a row stride that is a multiple of 4 (DeepGEMM
    # pads rows to 256 columns); a ragged prefill over 130 keys would otherwise have a row stride of 130.
    g = torch.Generator().manual_seed(6)
    q, k, weights = torch.randn(3, 4, 16, generator=g), torch.randn(130, 16, generator=g), torch.ones(3, 4)
    ranges = torch.zeros(3, dtype=torch.int32), torch.full((3,), 130, dtype=torch.int32)
    for logits in (ragged_logits(q, k, weights, *ranges),
                   paged_logits(q, torch.randn(3, 64, 16, generator=g), weights, torch.tensor([100, 5, 64]),
                                torch.tensor([[0, 1], [2, 0], [1, 2]], dtype=torch.int32))):
        assert logits.dtype == torch.float32 and logits.stride(1) == 1
        assert logits.stride(0) % 256 == 0 and logits.stride(0) >= logits.shape[1]
