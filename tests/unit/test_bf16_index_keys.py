"""bf16-index-keys on SGLang 0.5.23's real DSA classes, on CPU: the pool, the writer, the gather, the decode and
prefill logits paths and the sizing all follow the bf16 layout, and what the patch does not convert is refused.

What needs a GPU is left out and named: SGLang's fused top-k transform (a CUDA kernel; a stand-in that selects
with pdfleet's `topk_indices` receives the logits here) and the indexer's q projection and FP8 quantisation
(Triton; the queries are quantised here the way SGLang's act_quant does, with pdfleet's FP8 emulation).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import patched_sglang, requires

requires.installed("torch")
requires.installed("triton")

import torch  # noqa: E402

from pdfleet.kernels import compare, fp8, index_cache, reference, topk_indices  # noqa: E402
from pdfleet.runtime.patches import base, catalogue, registry, targets  # noqa: E402
from pdfleet.runtime.patches.impl import bf16_index_keys as patch  # noqa: E402
from tests.repro.stage import publish_context  # noqa: E402

VERSION = "0.5.23"
HEADS, DIM, PAGE = 64, 128, 64


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The patch installed in this process's SGLang, under a published server config (the pools read it); both
    are undone afterwards."""
    from sglang.srt import runtime_context

    patched_sglang.restore_after_test(monkeypatch, [patch.PATCH_ID])
    publish_context(1, "decode")
    base.apply([patch.PATCH_ID], VERSION, registry.implementations([patch.PATCH_ID]))
    yield
    runtime_context.reset_context()


def dsa_pool(size: int = 512, layers: int = 2) -> Any:
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    return DSATokenToKVPool(size=size, page_size=PAGE, kv_lora_rank=512, dtype=torch.bfloat16, qk_rope_head_dim=64,
                            layer_num=layers, device="cpu", index_head_dim=DIM, enable_memory_saver=False,
                            kv_cache_dim=576)


def indexer_using(monkeypatch: pytest.MonkeyPatch, pool: Any, top: int = 2048) -> Any:
    """A real `Indexer` object as far as the logits paths read it, reading `pool` as the forward's KV pool."""
    from sglang.srt.layers.attention.dsa import dsa_indexer

    monkeypatch.setattr(dsa_indexer, "get_token_to_kv_pool", lambda: pool)
    indexer = object.__new__(dsa_indexer.Indexer)
    indexer.__dict__.update(index_topk=top, num_init_tokens=0, num_local_tokens=0)
    return indexer


def sglang_queries(q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D] as SGLang's indexer hands it to the logits paths: e4m3 per (token, head) with a power-of-two
    scale, the scale folded into the weights ([T, H, 1], as _get_logits_head_gate returns them)."""
    values, scales = fp8.quantize(q)
    return values, (w * scales.squeeze(-1)).unsqueeze(-1)


class TopkStandIn:
    """SGLang's DSA indexer metadata as `_get_topk_paged` reads it; its top-k transform (CUDA) is replaced by
    pdfleet's `topk_indices`, and the logits it was given are kept."""

    def __init__(self, lengths: torch.Tensor, page_table: torch.Tensor, rows: int) -> None:
        self.lengths, self.page_table, self.rows = lengths.int(), page_table.int(), rows
        self.logits: torch.Tensor | None = None

    def get_seqlens_int32(self) -> torch.Tensor:
        return self.lengths

    get_seqlens_expanded = get_seqlens_int32

    def get_dsa_extend_len_cpu(self) -> list[int]:
        return [1] * self.rows

    def get_page_table_64(self) -> torch.Tensor:
        return self.page_table

    def topk_transform(self, logits: torch.Tensor, top: int) -> torch.Tensor:
        self.logits = logits
        return topk_indices(logits, top)


# --- the catalogue entry and the fingerprints ------------------------------------------------------------------

def test_the_catalogue_entry_the_implementation_and_the_fingerprints_agree() -> None:
    entry = catalogue.BY_ID[patch.PATCH_ID]
    assert entry.targets == patch.TARGETS and entry.kv_layout and entry.unavailable is None
    assert set(patch.FINGERPRINTS[VERSION]) == set(patch.TARGETS)
    assert registry.MODULES[patch.PATCH_ID] == patch.__name__
    for dotted, expected in patch.FINGERPRINTS[VERSION].items():
        assert targets.verify(dotted, expected).function is not None


def test_a_changed_target_is_refused_and_nothing_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.mem_cache.index_key_cache import IndexKeyCache

    patched_sglang.restore_after_test(monkeypatch, [patch.PATCH_ID])
    original_move = IndexKeyCache.move

    def move(self: Any, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:  # an upstream edit, say
        original_move(self, tgt_loc, src_loc)

    monkeypatch.setattr(IndexKeyCache, "move", move)
    with pytest.raises(base.PatchError, match=r"IndexKeyCache\.move"):
        base.apply([patch.PATCH_ID], VERSION, registry.implementations([patch.PATCH_ID]))
    assert not hasattr(IndexKeyCache._buffer_shape, "__pdfleet_patch__")


# --- the pool and its consumers --------------------------------------------------------------------------------

def test_the_pool_holds_256_bytes_per_token_and_every_byte_consumer_follows(patched: None) -> None:
    pool = dsa_pool(size=512, layers=2)
    buffer = pool.get_index_k_with_scale_buffer(0)
    pages = buffer.shape[0]
    assert buffer.dtype == torch.uint8 and buffer.shape[1] == PAGE * 256
    _, lengths, items = pool.get_state_buf_infos()  # what PD registers and moves, page by page
    assert items == [PAGE * 256] * 2 and lengths == [pages * PAGE * 256] * 2
    from sglang.srt.mem_cache.pool_host.dsa import dsa_indexer_bytes_per_token_per_layer

    assert dsa_indexer_bytes_per_token_per_layer(index_head_dim=DIM, quant_block_size=128) == 256


def test_keys_are_stored_moved_and_gathered_by_token_slot(patched: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer

    pool = dsa_pool()
    indexer = indexer_using(monkeypatch, pool)
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(5, DIM, generator=g).bfloat16()
    loc = torch.tensor([0, 1, 65, 130, 200])
    Indexer._store_index_k_cache(indexer, SimpleNamespace(out_cache_loc=loc), 1, keys)
    rows = pool.get_index_k_with_scale_buffer(1).view(torch.bfloat16).view(-1, DIM)
    assert torch.equal(rows[loc], keys)
    assert not pool.get_index_k_with_scale_buffer(0).any(), "layer 0 was not written"

    pool.index_key_cache.move(torch.tensor([300]), torch.tensor([65]))  # a speculative-decoding move
    assert torch.equal(rows[300], keys[2])

    # Two sequences: pages [0, 1] (66 tokens) and [3] (2 tokens from slot 192); concatenated in batch order.
    table = torch.tensor([[0, 1], [3, 0]], dtype=torch.int32)
    gathered, scales = pool.get_index_k_scale_buffer(1, torch.tensor([66, 2]), table, 68, 66)
    as_keys = gathered.view(torch.bfloat16)
    assert as_keys.shape == (68, DIM) and scales.view(torch.float32).eq(1).all()
    assert torch.equal(as_keys[[0, 1, 65]], keys[:3])
    assert torch.equal(as_keys[66:], rows[192:194])


def test_an_fp8_store_into_the_bf16_buffer_is_refused(patched: None) -> None:
    pool = dsa_pool()
    with pytest.raises(patch.UnsupportedLayout, match="FP8 index-key write reached layer 0"):
        pool.set_index_k_scale_buffer(layer_id=0, loc=torch.tensor([0]), index_k=torch.zeros(1, DIM),
                                      index_k_scale=torch.ones(1, 1))


# --- the logits paths ------------------------------------------------------------------------------------------

def test_decode_logits_come_from_the_bf16_keys_and_match_the_reference(patched: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    pool = dsa_pool(size=1024)
    indexer = indexer_using(monkeypatch, pool, top=64)
    g = torch.Generator().manual_seed(1)
    rows = pool.get_index_k_with_scale_buffer(0).view(torch.bfloat16).view(-1, DIM)
    rows.copy_(torch.randn(rows.shape, generator=g).bfloat16())
    table = torch.tensor([[2, 5, 0], [7, 0, 0], [4, 1, 3]], dtype=torch.int32)
    lengths = torch.tensor([130, 9, 192], dtype=torch.int32)
    q = torch.randn(4, HEADS, DIM, generator=g)  # three real rows and one row of graph padding
    w = torch.randn(4, HEADS, generator=g) / HEADS
    q8, weights = sglang_queries(q, w)
    metadata = TopkStandIn(lengths, table, rows=3)
    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE)
    selected = Indexer._get_topk_paged(indexer, batch, 0, q8, weights, metadata)

    keys = pool.get_index_k_with_scale_buffer(0).view(torch.bfloat16).view(-1, PAGE, DIM)
    want = reference.paged_logits(fp8.dequantize(*fp8.quantize(q))[:3], keys, w[:3], lengths, table, next_n=1)
    assert metadata.logits is not None and metadata.logits.shape == (3, 3 * PAGE)
    assert compare.same_masks(metadata.logits, want)
    finite = torch.isfinite(want)
    torch.testing.assert_close(metadata.logits[finite], want[finite], rtol=2e-4, atol=1e-4)
    assert selected.shape == (4, 64) and selected[3].eq(-1).all()
    assert compare.topk_recall(selected[:3], want, 64) >= 0.99
    assert int((selected[1] >= 0).sum()) == 9  # a 9-token context selects 9 and pads with -1


def test_prefill_logits_go_through_the_resolved_function_in_sglang_s_contract(patched: None) -> None:
    from sglang.srt.layers.attention.dsa import dsa_indexer

    pool = dsa_pool()
    g = torch.Generator().manual_seed(2)
    rows = pool.get_index_k_with_scale_buffer(0).view(torch.bfloat16).view(-1, DIM)
    rows.copy_(torch.randn(rows.shape, generator=g).bfloat16())
    table = torch.tensor([[1, 0], [4, 0]], dtype=torch.int32)
    k, k_scale = pool.get_index_k_scale_buffer(0, torch.tensor([40, 24]), table, 64, 40)
    # As _get_topk_ragged views them before it calls the resolved logits function.
    kv = (k.view(torch.float8_e4m3fn), k_scale.view(torch.float32).squeeze(-1))
    tokens = 10
    starts = torch.tensor([0] * 5 + [40] * 5, dtype=torch.int32)
    ends = torch.tensor([36, 37, 38, 39, 40, 60, 61, 62, 63, 64], dtype=torch.int32)
    q = torch.randn(tokens, HEADS, DIM, generator=g)
    w = torch.randn(tokens, HEADS, generator=g)
    q8, weights = sglang_queries(q, w)
    logits = dsa_indexer.resolve_fp8_mqa_logits_fn()(q8, kv, weights.squeeze(-1), starts, ends, clean_logits=False)
    want = reference.ragged_logits(fp8.dequantize(*fp8.quantize(q)), k.view(torch.bfloat16), w, starts, ends)
    assert compare.same_masks(logits, want)
    finite = torch.isfinite(want)
    torch.testing.assert_close(logits[finite], want[finite], rtol=2e-4, atol=1e-4)


# --- sizing ----------------------------------------------------------------------------------------------------

def test_the_gpu_cell_size_grows_from_132_to_256_bytes_per_token_per_layer() -> None:
    calls: list[dict[str, Any]] = []

    def fp8_cell_size(self: Any, **kwargs: Any) -> int:
        calls.append(kwargs)
        return 132 * 61  # SGLang's FP8 answer for DeepSeek V3.2's 61 indexer layers

    originals = {dotted: targets.resolve(dotted).function for dotted in patch.TARGETS}
    replaced = patch.replacements({**originals, patch.CELL_SIZE: fp8_cell_size})[patch.CELL_SIZE]
    kvc = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(
        architectures=["DeepseekV32ForCausalLM"], index_topk=2048, index_head_dim=DIM)))
    assert replaced(None, kvc=kvc, num_layers=61, allocate_all_layers=True) == 256 * 61
    assert calls == [{"kvc": kvc, "num_layers": 61, "allocate_all_layers": True}]


# --- what the patch does not convert ---------------------------------------------------------------------------

def test_deepseek_v4_s_indexer_pool_is_refused_with_the_reason(patched: None) -> None:
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4IndexerPool

    with pytest.raises(patch.UnsupportedLayout, match="DeepSeek V4 indexer pool keeps FP8 keys"):
        DeepSeekV4IndexerPool(size=256, page_size=PAGE, dtype=torch.bfloat16, index_head_dim=DIM, layer_num=1,
                              device="cpu", enable_memory_saver=False, use_fp4_indexer=False)


def test_a_sliding_window_dsa_model_is_refused_and_others_pass_through(patched: None) -> None:
    from sglang.srt.model_executor.pool_configurator import HybridSWAPoolConfigurator

    dsa = SimpleNamespace(architectures=["DeepseekV32ForCausalLM"], index_topk=2048, index_head_dim=DIM)
    with pytest.raises(patch.UnsupportedLayout, match="sliding-window DSA model"):
        HybridSWAPoolConfigurator(SimpleNamespace(model_config=SimpleNamespace(hf_config=dsa)))
    other = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(architectures=["Gemma3"])))
    with pytest.raises(AttributeError, match="kv_cache_dtype_str"):  # SGLang's own constructor ran
        HybridSWAPoolConfigurator(other)


def test_token_slots_follow_each_sequence_s_pages_in_batch_order() -> None:
    table = torch.tensor([[3, 1, 0], [2, 0, 0], [5, 4, 6]])
    lengths = torch.tensor([70, 0, 130])
    slots = index_cache.token_slots(lengths, table, 200, PAGE)
    expect = [3 * 64 + i for i in range(64)] + [64 + i for i in range(6)]
    expect += [5 * 64 + i for i in range(64)] + [4 * 64 + i for i in range(64)] + [6 * 64, 6 * 64 + 1]
    assert slots.tolist() == expect


def test_index_caches_that_interpret_fp8_themselves_are_refused(patched: None) -> None:
    from sglang.srt.mem_cache.index_key_cache import IndexKeyCache

    class LayerSplitLike(IndexKeyCache):
        pass

    cache = object.__new__(LayerSplitLike)
    cache.pool = SimpleNamespace(index_kpool=1, page_size=PAGE, index_head_dim=DIM)
    with pytest.raises(patch.UnsupportedLayout, match="LayerSplitLike"):
        cache._buffer_shape(4)
    plain = object.__new__(IndexKeyCache)
    plain.pool = SimpleNamespace(index_kpool=2, page_size=PAGE, index_head_dim=DIM)
    with pytest.raises(patch.UnsupportedLayout, match="index_kpool 2"):
        plain._buffer_shape(4)
