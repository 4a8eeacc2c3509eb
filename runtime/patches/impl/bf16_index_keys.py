"""bf16-index-keys: DeepSeek V3.2's DSA index keys stored in bf16 and scored by pdfleet's kernels.

Why. The DSA indexer picks each query token's top 2048 keys by sum_h w[h] * ReLU(q[h] . k). SGLang 0.5.23 keeps
index keys in FP8 (a page of 64 tokens is 64 x 128 e4m3 bytes then 64 fp32 scales: 132 B per token per layer)
and scores them with DeepGEMM's fp8_mqa_logits / fp8_paged_mqa_logits, which exist for SM90 and SM100 only. On
any other GPU (SM120: RTX PRO 6000 Blackwell) V3.2 has no working path but SGLang's torch fallback, switched on
by hand, which materialises [rows, context, heads] scores, rounds every per-head product to bf16 and refuses
next_n > 1 (no MTP).

How. The index-key buffer keeps its uint8 type and one-page-per-row shape, so everything that moves it as bytes
(PD transfer, retraction copies, checksums, the HiCache host pool) follows; a page becomes 64 bf16 keys of 128
(16 KiB, 256 B per token), so token slot `loc` is row `loc` of the buffer viewed as bf16 [-1, 128]. Replaced:
- the buffer's shape, and the two places that size it apart from the buffer: the pool configurator's per-token
  cell size (how many tokens fit in GPU memory) and the HiCache host pool's bytes per token;
- the writer (`Indexer._store_index_k_cache`, and the fused norm-rope-store that would write FP8 directly), the
  token move (speculative decoding) and the ragged gather, all plain row indexing now; an FP8 store into the
  buffer (`store_quantized`) raises, so a path this patch does not cover fails loudly instead of corrupting keys;
- the decode logits (`Indexer._get_topk_paged`: `pdfleet.kernels.paged_logits`, every row its own sequence) and
  the prefill logits (the logits function `_get_topk_ragged` resolves: `pdfleet.kernels.ragged_logits`); SGLang's
  own masks, chunking and top-k transform stay;
- `_use_torch_mqa_logits`, so SGLang takes its device SM count and its own paged schedule metadata instead of
  DeepGEMM's, which does not run on SM120 (the kernels here need no schedule metadata).
Queries keep SGLang's FP8 quantisation: one power-of-two scale per (token, head) folded into the weights, exact
since w * s * ReLU(q8 . k) = w * ReLU(s * q8 . k) for s > 0; e4m3 values convert to bf16 exactly.

Refused at engine start, with the reason (each would keep or interpret FP8 keys this patch does not convert):
DeepSeek V4's compressed indexer pool (its keys are written by the compressor's fused kernels; SGLang's own SM120
paths for V4 compute the per-head ReLU correctly), pooled index keys (index_kpool > 1), the layer-split,
page-interleave and HiSparse index caches, sliding-window DSA models (their pool configurator sizes index keys
itself), and ROCm.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

PATCH_ID = "bf16-index-keys"

_CACHE = "sglang.srt.mem_cache.index_key_cache.IndexKeyCache"
_INDEXER_MODULE = "sglang.srt.layers.attention.dsa.dsa_indexer"
_INDEXER = f"{_INDEXER_MODULE}.Indexer"
BUFFER_SHAPE = f"{_CACHE}._buffer_shape"
MOVE = f"{_CACHE}.move"
GET_K_AND_SCALE = f"{_CACHE}.get_k_and_scale"
STORE_QUANTIZED = f"{_CACHE}.store_quantized"
STORE = f"{_INDEXER}._store_index_k_cache"
FUSED_K_STORE = f"{_INDEXER}._fused_k_prepare_and_store"
TOPK_PAGED = f"{_INDEXER}._get_topk_paged"
RAGGED_LOGITS_FN = f"{_INDEXER_MODULE}.resolve_fp8_mqa_logits_fn"
USE_TORCH_MQA_LOGITS = "sglang.srt.layers.attention.dsa.utils._use_torch_mqa_logits"
_CONFIGURATOR = "sglang.srt.model_executor.pool_configurator"
CELL_SIZE = f"{_CONFIGURATOR}.DefaultPoolConfigurator._compute_dsa_indexer_cell_size"
SWA_CONFIGURATOR = f"{_CONFIGURATOR}.HybridSWAPoolConfigurator.__init__"  # sizes DSA index keys at 132 B itself
HOST_BYTES = "sglang.srt.mem_cache.pool_host.dsa.dsa_indexer_bytes_per_token_per_layer"
V4_BUFFER = "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4IndexerPool._create_buffer"
# Fingerprinted only: the call sites and contracts the replacements rely on.
TOPK_RAGGED = f"{_INDEXER}._get_topk_ragged"  # views the gathered keys as fp8 and its scales as fp32
FORWARD = f"{_INDEXER}.forward_cuda"  # quantises q per (token, head) and folds the scale into the weights
FORWARD_K_ONLY = f"{_INDEXER}._forward_cuda_k_only"
FUSED_Q_STORE = f"{_INDEXER}._fused_q_prepare_and_store"
READ_BUFFER = f"{_INDEXER}._get_index_k_read_buffer"
CACHE_INIT = f"{_CACHE}.__init__"  # allocates uint8 buffers of _buffer_shape
KERNEL_VIEW = f"{_CACHE}._kernel_view"
STATE_BUFFERS = f"{_CACHE}.state_buf_infos"  # PD moves whole pages as bytes
POOL_INIT = "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool.__init__"
HOST_POOL_DECL = "sglang.srt.mem_cache.pool_host.dsa.make_dsa_indexer_pool_decl"

TARGETS = (BUFFER_SHAPE, MOVE, GET_K_AND_SCALE, STORE_QUANTIZED, STORE, FUSED_K_STORE, TOPK_PAGED, RAGGED_LOGITS_FN,
           USE_TORCH_MQA_LOGITS, CELL_SIZE, HOST_BYTES, V4_BUFFER, SWA_CONFIGURATOR, TOPK_RAGGED, FORWARD,
           FORWARD_K_ONLY, FUSED_Q_STORE, READ_BUFFER, CACHE_INIT, KERNEL_VIEW, STATE_BUFFERS, POOL_INIT,
           HOST_POOL_DECL)

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        BUFFER_SHAPE: "23b48d2196a5b382",
        MOVE: "aaf3dd05f6cbc3e9",
        GET_K_AND_SCALE: "740fa6a85b8c33b2",
        STORE_QUANTIZED: "f0512aa9cda97502",
        STORE: "0b47ba51e146bb81",
        FUSED_K_STORE: "fd8165c01e24a0e4",
        TOPK_PAGED: "32a7d7f5c61beae9",
        RAGGED_LOGITS_FN: "dfc5e7f09d66503c",
        USE_TORCH_MQA_LOGITS: "e73087ef11486601",
        CELL_SIZE: "28d15faf502881f3",
        HOST_BYTES: "98e75cb1bcbdbdd4",
        V4_BUFFER: "7ef19d3e053381c9",
        SWA_CONFIGURATOR: "2c0dc48e0dfc647f",
        TOPK_RAGGED: "8bd89072567d96b3",
        FORWARD: "29e72ad86e898ee7",
        FORWARD_K_ONLY: "82464171a1622228",
        FUSED_Q_STORE: "1ecfab622ecfc742",
        READ_BUFFER: "4a8248a370c67c60",
        CACHE_INIT: "cf806f70abed4703",
        KERNEL_VIEW: "e5f3171f3c322e27",
        STATE_BUFFERS: "785f519bc3e05207",
        POOL_INIT: "32eca680590b3cba",
        HOST_POOL_DECL: "fda87d665bcdee11",
    },
}


class UnsupportedLayout(RuntimeError):
    """An engine configuration whose index keys this patch would leave in FP8 or misread."""


def refuse_unsupported(cache: Any, plain_cache: type, on_rocm: bool) -> None:
    pool = cache.pool
    if type(cache) is not plain_cache:
        raise UnsupportedLayout(
            f"{PATCH_ID}: this engine's DSA index keys live in a {type(cache).__name__} (layer split, page "
            "interleave or HiSparse), whose FP8 accessors pdfleet does not replace: drop those options or the patch")
    if pool.index_kpool != 1:
        raise UnsupportedLayout(f"{PATCH_ID}: pooled index keys (index_kpool {pool.index_kpool}) keep their own "
                                "FP8 layout; run with index_kpool 1 or without the patch")
    if on_rocm:
        raise UnsupportedLayout(f"{PATCH_ID}: ROCm's DSA indexer writes FP8 keys with aiter; the patch is for CUDA")


def replacements(originals: Mapping[str, Callable[..., Any]]) -> Mapping[str, Callable[..., Any]]:
    # Imported here, inside the engine: the runtime's modules import the standard library alone (the launcher
    # lists the catalogue on any Python), and SGLang's image brings torch and Triton.
    import torch
    from sglang.srt.mem_cache.index_key_cache import IndexKeyCache
    from sglang.srt.utils import is_hip

    from pdfleet import kernels
    from pdfleet.kernels import fp8, index_cache

    indexer = sys.modules[_INDEXER_MODULE]
    on_rocm = bool(is_hip())
    original_cell_size = originals[CELL_SIZE]
    original_swa_configurator = originals[SWA_CONFIGURATOR]
    configurator = sys.modules[_CONFIGURATOR]

    def _buffer_shape(self: Any, num_pages: int) -> tuple[int, int]:
        refuse_unsupported(self, IndexKeyCache, on_rocm)
        return num_pages, self.pool.page_size * index_cache.bytes_per_token(self.pool.index_head_dim)

    def move(self: Any, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        if tgt_loc.numel() == 0:
            return
        for buffer in self.buffer:
            if buffer.shape[0]:
                index_cache.move_keys(buffer, self.pool.index_head_dim, tgt_loc, src_loc)

    def get_k_and_scale(self: Any, layer_id: int, seq_len_tensor: torch.Tensor, page_indices: torch.Tensor,
                        seq_len_sum: int, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys = index_cache.gather_keys(self.get_buffer(layer_id), self.pool.index_head_dim, seq_len_tensor,
                                       page_indices, seq_len_sum, self.pool.page_size)
        # As SGLang's gather returns them: key bytes and one fp32 scale per key (ones, unused; see bf16_mqa_logits).
        scales = torch.ones(keys.shape[0], 1, dtype=torch.float32, device=keys.device)
        return keys.view(torch.uint8), scales.view(torch.uint8)

    def store_quantized(self: Any, layer_id: int, loc: torch.Tensor, index_k: torch.Tensor,
                        index_k_scale: torch.Tensor) -> None:
        raise UnsupportedLayout(f"{PATCH_ID}: an FP8 index-key write reached layer {layer_id}'s bf16 buffer, "
                                "through a path the patch does not cover; refusing to corrupt the keys")

    def _store_index_k_cache(self: Any, forward_batch: Any, layer_id: int, key: torch.Tensor, *,
                             act_quant: Any = None, out_cache_loc: torch.Tensor | None = None) -> None:
        loc = forward_batch.out_cache_loc if out_cache_loc is None else out_cache_loc
        index_cache.store_keys(indexer.get_token_to_kv_pool().get_index_k_with_scale_buffer(layer_id=layer_id), loc,
                               key)

    def _fused_k_prepare_and_store(self: Any, key_raw: torch.Tensor, positions: torch.Tensor, forward_batch: Any,
                                   layer_id: int, act_quant: Any, out_cache_loc: torch.Tensor | None = None) -> None:
        # SGLang's own unfused branch: its fused kernel would quantise into the FP8 layout.
        key = indexer.fused_k_indexer_norm_rope(key_raw, self.k_norm.weight, self.k_norm.bias,
                                                self.k_norm.variance_epsilon, self._indexer_cos_sin_cache, positions)
        self._store_index_k_cache(forward_batch=forward_batch, layer_id=layer_id, key=key, act_quant=act_quant,
                                  out_cache_loc=out_cache_loc)

    def _get_topk_paged(self: Any, forward_batch: Any, layer_id: int, q_fp8: torch.Tensor, weights: torch.Tensor,
                        metadata: Any) -> torch.Tensor:
        mode = forward_batch.forward_mode
        expanded = mode.is_target_verify() or mode.is_draft_extend_v2()
        lengths = metadata.get_seqlens_expanded() if expanded else metadata.get_seqlens_int32()
        rows = sum(metadata.get_dsa_extend_len_cpu())  # rows past it are padding (attention TP, graph capture)
        cache = self._get_index_k_read_buffer(indexer.get_token_to_kv_pool(), layer_id)
        # Every row is its own sequence with next_n 1 (per-row lengths and block-table rows), as SGLang's split
        # DeepGEMM call treats them, so verify and draft-extend rows need no special case.
        logits = kernels.paged_logits(q_fp8[:rows].to(torch.bfloat16), cache.view(torch.bfloat16),
                                      weights.squeeze(2)[:rows], lengths.reshape(-1)[:rows],
                                      metadata.get_page_table_64()[:rows], next_n=1)
        self._mask_init_and_local_tokens(logits, lengths)
        topk = metadata.topk_transform(logits, self.index_topk)
        if rows < q_fp8.shape[0]:
            padding = topk.new_full((q_fp8.shape[0] - rows, topk.shape[1]), -1)
            topk = torch.cat([topk, padding], dim=0)
        return topk

    def bf16_mqa_logits(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                        ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool = False, **_: Any) -> torch.Tensor:
        """Prefill logits in the form of DeepGEMM's fp8_mqa_logits, from the bf16 keys the gather returned
        (which `_get_topk_ragged` has viewed as fp8 bytes)."""
        return kernels.ragged_logits(q.to(torch.bfloat16), kv[0].view(torch.bfloat16), weights, ks, ke)

    def resolve_mqa_logits_fn() -> Callable[..., torch.Tensor]:
        return bf16_mqa_logits

    def use_torch_mqa_logits() -> bool:
        return True

    def _compute_dsa_indexer_cell_size(self: Any, *, kvc: Any, num_layers: int,
                                       allocate_all_layers: bool = False) -> int:
        fp8_cell = original_cell_size(self, kvc=kvc, num_layers=num_layers, allocate_all_layers=allocate_all_layers)
        dim = configurator.get_dsa_index_head_dim(kvc.model_config.hf_config)
        return fp8_cell * index_cache.bytes_per_token(dim) // fp8.bytes_per_token(dim)

    def dsa_indexer_bytes_per_token_per_layer(*, index_head_dim: int, quant_block_size: int) -> int:
        return index_cache.bytes_per_token(index_head_dim)

    def swa_configurator_init(self: Any, kvc: Any) -> None:
        if configurator.is_deepseek_dsa(kvc.model_config.hf_config):
            raise UnsupportedLayout(f"{PATCH_ID}: this sliding-window DSA model's pool sizing counts FP8 index keys "
                                    "(132 B per token), which pdfleet does not convert; run it without the patch")
        original_swa_configurator(self, kvc)

    def _create_buffer(self: Any) -> None:
        raise UnsupportedLayout(
            f"{PATCH_ID} converts DeepSeek V3.2's DSA index keys; this model's DeepSeek V4 indexer pool keeps "
            "FP8 keys written by its compressor, which pdfleet does not convert. Remove the patch for V4 "
            "(SGLang 0.5.23's own SM120 indexer paths for V4 compute the per-head ReLU)")

    return {
        BUFFER_SHAPE: _buffer_shape, MOVE: move, GET_K_AND_SCALE: get_k_and_scale,
        STORE_QUANTIZED: store_quantized, STORE: _store_index_k_cache, FUSED_K_STORE: _fused_k_prepare_and_store,
        TOPK_PAGED: _get_topk_paged, RAGGED_LOGITS_FN: resolve_mqa_logits_fn,
        USE_TORCH_MQA_LOGITS: use_torch_mqa_logits, CELL_SIZE: _compute_dsa_indexer_cell_size,
        HOST_BYTES: dsa_indexer_bytes_per_token_per_layer, V4_BUFFER: _create_buffer,
        SWA_CONFIGURATOR: swa_configurator_init,
    }
