"""pdfleet's indexer kernels compiled for an NVIDIA GPU, against the fp32 definition computed on the CPU.

The edge cases the interpreter runs (tests/unit/test_indexer_kernels.py) and moderate serving shapes (64 heads,
D=128, thousands of keys, next_n up to 4, every pages_per_program regime). On a GPU the operands reach the
tensor cores as bf16 with fp32 accumulation, a different arithmetic from the interpreter's fp32 casts, so the
same acceptance is checked again. The reference runs on the CPU, so these tests need only Triton and torch's
device copies on the GPU, not cuBLAS. Skipped, with the reason, where no GPU is visible (tests/conftest.py).
"""

from __future__ import annotations

import pytest

from tests.support import requires

requires.installed("torch")
requires.installed("triton")

import torch  # noqa: E402

from pdfleet.kernels import paged_logits, ragged_logits, reference, topk_indices  # noqa: E402
from tests.support import indexer  # noqa: E402

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
TOP_K = 2048


def on_gpu(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(CUDA) for t in tensors)


def check(got: torch.Tensor, want: torch.Tensor, top_ks: tuple[int, ...] = (1, 16, TOP_K)) -> None:
    assert got.device.type == CUDA.type
    got = got.cpu()
    indexer.assert_logits_match(got, want)
    for k in top_ks:
        indexer.assert_topk_match(got, want, k)


@pytest.mark.parametrize("case", indexer.PAGED_CASES)
def test_paged_edge_cases_match_the_fp32_reference(case: str) -> None:
    next_n, inputs = indexer.paged_case(case)
    check(paged_logits(*on_gpu(inputs), next_n=next_n), reference.paged_logits(*inputs, next_n=next_n))


@pytest.mark.parametrize("case", indexer.RAGGED_CASES)
def test_ragged_edge_cases_match_the_fp32_reference(case: str) -> None:
    inputs = indexer.ragged_case(case)
    check(ragged_logits(*on_gpu(inputs)), reference.ragged_logits(*inputs), top_ks=(1, 8, TOP_K))


# Full sequences, sequences ending inside a page, one token, an empty one: 128 pages of table, 64 x 128 heads.
MODERATE_CONTEXTS = [8192, 5000, 4097, 64, 1, 0, 3000, 7777]


@pytest.mark.parametrize("next_n", [1, 2, 4])
@pytest.mark.parametrize("pages_per_program", [1, 8, 32])
def test_paged_logits_at_a_moderate_shape(next_n: int, pages_per_program: int) -> None:
    g = torch.Generator().manual_seed(100 * next_n + pages_per_program)
    inputs = indexer.random_paged(len(MODERATE_CONTEXTS), next_n, 64, 128, MODERATE_CONTEXTS, 128, g)
    got = paged_logits(*on_gpu(inputs), next_n=next_n, pages_per_program=pages_per_program)
    check(got, reference.paged_logits(*inputs, next_n=next_n))


@pytest.mark.parametrize("layout", ["causal", "three-prompts"])
def test_ragged_logits_at_a_moderate_shape(layout: str) -> None:
    tokens, heads, dim = 1024, 64, 128
    g = torch.Generator().manual_seed(7)
    q = torch.randn(tokens, heads, dim, generator=g).bfloat16()
    k = torch.randn(tokens, dim, generator=g).bfloat16()
    weights = torch.randn(tokens, heads, generator=g)
    position = torch.arange(tokens, dtype=torch.int32)
    # Three prompts packed back to back (300, 500, 224 tokens): each token sees its own prompt's prefix.
    prompt = torch.bucketize(position, torch.tensor([300, 800], dtype=torch.int32), right=True)
    starts = torch.tensor([0, 300, 800], dtype=torch.int32)[prompt]
    if layout == "causal":
        starts = torch.zeros_like(starts)
    inputs = (q, k, weights, starts, position + 1)
    check(ragged_logits(*on_gpu(inputs)), reference.ragged_logits(*inputs))


def test_fp32_inputs_give_the_same_logits_as_bf16_values() -> None:
    g = torch.Generator().manual_seed(4)
    q, k_cache, weights, context_lens, tables = on_gpu(indexer.random_paged(2, 1, 64, 128, [640, 333], 10, g))
    indexer.assert_logits_match(paged_logits(q.float(), k_cache.float(), weights, context_lens, tables).cpu(),
                        paged_logits(q, k_cache, weights, context_lens, tables).cpu())


def test_paged_logits_accept_upstream_cache_shapes() -> None:
    g = torch.Generator().manual_seed(2)
    q, k_cache, weights, context_lens, tables = on_gpu(indexer.random_paged(2, 1, 64, 128, [900, 10], 15, g))
    want = paged_logits(q, k_cache, weights, context_lens, tables)
    for shaped in (k_cache.unsqueeze(2), k_cache.flatten(1)):  # [pages, 64, 1, D] and [pages, 64 * D]
        assert torch.equal(paged_logits(q, shaped, weights, context_lens, tables), want)


def test_topk_on_the_gpu_pads_as_on_the_cpu() -> None:
    logits = torch.tensor([[0.5, float("-inf"), 2.0], [float("-inf")] * 3])
    picked = topk_indices(logits.to(CUDA), 5)
    assert picked.device.type == CUDA.type and picked.dtype == torch.int32
    assert sorted(picked[0].tolist()) == [-1, -1, -1, 0, 2] and picked[1].tolist() == [-1] * 5
