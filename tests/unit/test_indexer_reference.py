"""The indexer's definition against the shortcuts around it: upstream's FP8 layout, and folding the heads.

The FP8 emulation stores keys as upstream does (e4m3 values, one ue8m0 scale per key, 132 B per token) and must
agree with the fp32 path (calc_diff < 1e-3, DeepGEMM's bound). Folding the heads into one query drops the
per-head ReLU: on inputs whose per-head products have mixed signs it picks a materially different top-k set,
and only when every product is non-negative is it the same score.
"""

from __future__ import annotations

from tests.support import requires

requires.installed("torch")

import torch  # noqa: E402

from pdfleet.kernels import compare, fp8, reference, topk_indices  # noqa: E402


def test_fp8_pages_use_upstream_layout_and_read_back_close() -> None:
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(3, reference.PAGE_SIZE, 128, generator=g).bfloat16()
    packed = fp8.pack_pages(keys)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 64 * 132)
    assert fp8.bytes_per_token(128) == 132
    scales = packed[:, 64 * 128:].contiguous().view(torch.float32)
    assert torch.equal(torch.exp2(torch.log2(scales).round()), scales), "ue8m0 scales are powers of two"
    restored = fp8.unpack_pages(packed, 128)
    assert compare.calc_diff(restored, keys.float()) < 1e-3
    assert (restored - keys.float()).abs().max() <= keys.float().abs().max() / 8  # three mantissa bits


def test_fp8_paged_logits_agree_with_the_fp32_path() -> None:
    g = torch.Generator().manual_seed(1)
    batch, next_n, heads, dim, max_pages = 3, 2, 64, 128, 4
    k_cache = torch.randn(16, 64, dim, generator=g).bfloat16()
    tables = torch.randperm(16, generator=g)[:batch * max_pages].view(batch, max_pages).int()
    context_lens = torch.tensor([256, 100, 3], dtype=torch.int32)
    q = torch.randn(batch * next_n, heads, dim, generator=g).bfloat16()
    weights = torch.randn(batch * next_n, heads, generator=g)
    exact = reference.paged_logits(q, k_cache, weights, context_lens, tables, next_n)
    emulated = fp8.paged_logits(q, fp8.pack_pages(k_cache), weights, context_lens, tables, next_n)
    assert compare.same_masks(emulated, exact)
    assert compare.calc_diff(emulated, exact) < 1e-3


def test_fp8_ragged_logits_agree_with_the_fp32_path() -> None:
    g = torch.Generator().manual_seed(2)
    tokens, heads, dim = 40, 64, 128
    q = torch.randn(tokens, heads, dim, generator=g).bfloat16()
    k = torch.randn(tokens, dim, generator=g).bfloat16()
    weights = torch.randn(tokens, heads, generator=g)
    starts, ends = torch.zeros(tokens, dtype=torch.int32), torch.arange(1, tokens + 1, dtype=torch.int32)
    exact = reference.ragged_logits(q, k, weights, starts, ends)
    assert compare.calc_diff(fp8.ragged_logits(q, k, weights, starts, ends), exact) < 1e-3


def folded_recall(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, top: int) -> float:
    everything = torch.zeros(q.shape[0], dtype=torch.int32), torch.full((q.shape[0],), k.shape[0], dtype=torch.int32)
    exact = reference.ragged_logits(q, k, weights, *everything)
    folded = reference.ragged_logits(q, k, weights, *everything, scores=reference.folded_scores)
    return compare.topk_recall(topk_indices(folded, top), exact, top)


def test_folding_the_heads_changes_the_top_k_set_materially() -> None:
    g = torch.Generator().manual_seed(3)
    tokens, keys, heads, dim, top = 8, 4096, 64, 128, 512
    q = torch.randn(tokens, heads, dim, generator=g)
    k = torch.randn(keys, dim, generator=g)
    weights = torch.rand(tokens, heads, generator=g) / heads  # positive, as often after training: still wrong
    products = torch.einsum("thd,sd->ths", q, k)
    assert 0.4 < float((products < 0).float().mean()) < 0.6  # mixed signs: the ReLU decides
    assert folded_recall(q, k, weights, top) < 0.8


def test_folding_is_exact_only_when_no_product_is_negative() -> None:
    g = torch.Generator().manual_seed(4)
    q = torch.rand(4, 16, 32, generator=g)
    k = torch.rand(600, 32, generator=g)
    weights = torch.rand(4, 16, generator=g)
    assert folded_recall(q, k, weights, 64) >= 0.99
