"""An emulation of upstream's FP8 index keys, to compare pdfleet's bf16 layout against on any machine.

Upstream quantises each key (and each query head) with one power-of-two ("ue8m0") scale per 128-element
block: scale = 2^ceil(log2(amax / 448)), value = e4m3(clamp(x / scale, +-448)), amax floored at 1e-4. SGLang
stores a page of 64 keys as the 64 * 128 e4m3 bytes followed by the 64 fp32 scales, 132 bytes per token per
layer. The score is then s_k * sum_h (w[h] * s_q[h]) * ReLU(q8 . k8); scales are positive, so that equals the
fp32 score of the dequantised vectors, which is what `paged_logits` and `ragged_logits` compute here (plain
torch: CPUs cast to and from float8_e4m3fn).
"""

from __future__ import annotations

import torch

from pdfleet.kernels import reference

FP8_MAX = 448.0
BLOCK = 128
SCALE_BYTES = 4


def quantize(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (e4m3 values [..., D], fp32 ue8m0 scales [..., ceil(D / block)])."""
    blocks = -(-x.shape[-1] // block)
    padded = torch.nn.functional.pad(x.float(), (0, blocks * block - x.shape[-1]))
    grouped = padded.unflatten(-1, (blocks, block))
    amax = grouped.abs().amax(dim=-1).clamp(min=1e-4)
    scales = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))
    values = (grouped / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return values.flatten(-2)[..., :x.shape[-1]], scales


def dequantize(values: torch.Tensor, scales: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    expanded = scales.repeat_interleave(block, dim=-1)[..., :values.shape[-1]]
    return values.float() * expanded


def roundtrip(x: torch.Tensor) -> torch.Tensor:
    """What an FP8-stored tensor reads back as."""
    return dequantize(*quantize(x))


def pack_pages(k_cache: torch.Tensor) -> torch.Tensor:
    """bf16 keys [pages, 64, D] (D <= 128: one scale per key) -> upstream's page bytes [pages, 64 * (D + 4)]."""
    pages, slots, dim = k_cache.shape
    if dim > BLOCK:
        raise ValueError(f"upstream's index keys carry one scale per key, so D <= {BLOCK}; got {dim}")
    values, scales = quantize(k_cache)
    body = values.view(torch.uint8).reshape(pages, slots * dim)
    tail = scales.reshape(pages, slots).contiguous().view(torch.uint8)
    return torch.cat([body, tail], dim=1)


def unpack_pages(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """Upstream's page bytes -> the dequantised keys [pages, 64, D] in fp32."""
    pages = packed.shape[0]
    slots = packed.shape[1] // (dim + SCALE_BYTES)
    values = packed[:, :slots * dim].contiguous().view(torch.float8_e4m3fn).reshape(pages, slots, dim)
    scales = packed[:, slots * dim:].contiguous().view(torch.float32).reshape(pages, slots, 1)
    return dequantize(values, scales)


def bytes_per_token(dim: int = BLOCK) -> int:
    """Index-key bytes per token per layer in upstream's layout (132 for D = 128)."""
    return dim + SCALE_BYTES * -(-dim // BLOCK)


def paged_logits(q: torch.Tensor, packed_pages: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                 block_tables: torch.Tensor, next_n: int) -> torch.Tensor:
    """Decode logits from FP8 pages and FP8-quantised queries (per token and head), as upstream computes them."""
    keys = unpack_pages(packed_pages, q.shape[-1])
    return reference.paged_logits(roundtrip(q), keys, weights, context_lens, block_tables, next_n)


def ragged_logits(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, starts: torch.Tensor,
                  ends: torch.Tensor) -> torch.Tensor:
    """Prefill logits with FP8-quantised queries and keys."""
    return reference.ragged_logits(roundtrip(q), roundtrip(k), weights, starts, ends)
