"""What bf16 index keys cost in KV capacity: DeepSeek V3.2's KV bytes per token, FP8 keys vs bf16 keys.

Both figures come from SGLang 0.5.23's own `DSATokenToKVPool`, built on CPU at V3.2's shapes (61 layers, MLA
latent 512 + RoPE 64, index keys 128 wide, page 64), first as SGLang ships it, then with pdfleet's
bf16-index-keys patch applied: bytes per token are what the pool allocates (`get_kv_size_bytes`) over the
tokens it holds. Two MLA layouts: SGLang's FP8 latent for DSA (512 e4m3 + 4 fp32 scales + 64 bf16 RoPE = 656 B
per layer) and a bf16 latent (576 x 2 = 1152 B). MLA KV is not split across tensor-parallel ranks, so the
figures hold per GPU. Printed: bytes per token, a 128k-token request's KV, and what a GPU with a given KV budget
holds: the capacity a user gives up for the bf16 keys.

    python benchmarks/bench_indexer_memory.py [--budget-gib 40]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAYERS, KV_LORA_RANK, ROPE_DIM, INDEX_DIM, PAGE = 61, 512, 64, 128, 64
CONTEXT = 128 * 1024
POOL_TOKENS = 16 * PAGE
MLA_LAYOUTS = {"fp8 latent (656 B/layer)": ("float8_e4m3fn", 656), "bf16 latent (1152 B/layer)": ("bfloat16", 576)}


def bytes_per_token(dtype_name: str, kv_cache_dim: int) -> float:
    import torch
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    pool = DSATokenToKVPool(size=POOL_TOKENS, page_size=PAGE, kv_lora_rank=KV_LORA_RANK,
                            dtype=getattr(torch, dtype_name), qk_rope_head_dim=ROPE_DIM, layer_num=LAYERS,
                            device="cpu", index_head_dim=INDEX_DIM, enable_memory_saver=False,
                            kv_cache_dim=kv_cache_dim)
    slots = pool.get_index_k_with_scale_buffer(0).shape[0] * PAGE  # the index buffer's pages bound the slots
    return pool.get_kv_size_bytes() / slots


def measure() -> dict[str, tuple[float, float]]:
    from pdfleet.runtime.patches import base, registry
    from tests.repro.stage import publish_context

    publish_context(1, "decode")
    shipped = {name: bytes_per_token(*layout) for name, layout in MLA_LAYOUTS.items()}
    base.apply(["bf16-index-keys"], "0.5.23", registry.implementations(["bf16-index-keys"]))
    patched = {name: bytes_per_token(*layout) for name, layout in MLA_LAYOUTS.items()}
    return {name: (shipped[name], patched[name]) for name in MLA_LAYOUTS}


def report(figures: dict[str, tuple[float, float]], budget_gib: float) -> str:
    budget = budget_gib * 2**30
    lines = [f"DeepSeek V3.2 KV per token ({LAYERS} layers), SGLang 0.5.23's DSATokenToKVPool; "
             f"a {budget_gib:g} GiB KV budget per GPU; requests of {CONTEXT // 1024}k tokens",
             f"{'MLA layout':<28}{'fp8 keys B/tok':>15}{'bf16 keys B/tok':>16}{'x':>7}"
             f"{'128k req fp8':>14}{'128k req bf16':>15}{'tokens fp8':>12}{'tokens bf16':>13}{'given up':>10}"]
    for name, (fp8, bf16) in figures.items():
        tokens_fp8, tokens_bf16 = int(budget // fp8), int(budget // bf16)
        lines.append(f"{name:<28}{fp8:>15,.0f}{bf16:>16,.0f}{bf16 / fp8:>7.3f}"
                     f"{fp8 * CONTEXT / 2**30:>11.2f} GiB{bf16 * CONTEXT / 2**30:>11.2f} GiB"
                     f"{tokens_fp8:>12,}{tokens_bf16:>13,}{1 - tokens_bf16 / tokens_fp8:>10.1%}")
    lines.append(f"index keys alone: {(figures[next(iter(figures))][1] - figures[next(iter(figures))][0]) / LAYERS:.0f}"
                 " B more per token per layer (132 -> 256)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-gib", type=float, default=40.0, help="KV memory per GPU (default 40 GiB)")
    args = parser.parse_args()
    print(report(measure(), args.budget_gib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
