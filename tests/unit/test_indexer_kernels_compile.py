"""The indexer kernels compile for the GPUs they are for (Hopper sm_90a, Blackwell datacenter sm_100a, Blackwell
workstation sm_120), on this CPU, launched from their real wrappers at DeepSeek V3.2's shapes: their dots run on
each architecture's tensor cores, keys stream through shared memory in 16-byte asynchronous copies (pipelined),
and nothing spills to local memory.

Triton's interpreter, which runs the kernels in `make test`, never lowers them, so a kernel can pass every CPU
test and still not build, or build into scalar loads, on the first GPU it meets. What the compiled code costs in
time is for `make gpu-check` on a GPU.
"""

from __future__ import annotations

import pytest

from tests.support import requires

requires.installed("torch")
requires.installed("triton")

import torch  # noqa: E402

from pdfleet.kernels import paged_logits, ragged_logits  # noqa: E402
from tests.support.kernel_compile import compiling  # noqa: E402

TENSOR_CORES = {90: "wgmma.mma_async", 100: "tcgen05.mma", 120: "mma.sync.aligned"}
HEADS, DIM = 64, 128


@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("capability", TENSOR_CORES)
def test_the_decode_kernel_uses_tensor_cores_streams_keys_asynchronously_and_never_spills(
        capability: int, next_n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    batch, max_pages = 2, 512  # 32k-token contexts
    q = torch.zeros(batch * next_n, HEADS, DIM, dtype=torch.bfloat16)
    cache = torch.zeros(batch * max_pages, 64, DIM, dtype=torch.bfloat16)
    tables = torch.arange(batch * max_pages, dtype=torch.int32).view(batch, max_pages)
    with compiling(monkeypatch, capability) as compiled:
        paged_logits(q, cache, torch.zeros(batch * next_n, HEADS), torch.full((batch,), 32768), tables, next_n)
    [kernel] = compiled
    assert kernel.uses(TENSOR_CORES[capability])
    assert kernel.uses("cp.async.cg.shared.global"), "keys are not streamed with 16-byte asynchronous copies"
    assert (kernel.spill_stores, kernel.spill_loads) == (0, 0), kernel.registers


@pytest.mark.parametrize("capability", TENSOR_CORES)
def test_the_prefill_kernel_uses_tensor_cores_streams_keys_asynchronously_and_never_spills(
        capability: int, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = 4096
    q = torch.zeros(tokens, HEADS, DIM, dtype=torch.bfloat16)
    k = torch.zeros(tokens, DIM, dtype=torch.bfloat16)
    causal = torch.zeros(tokens, dtype=torch.int32), torch.arange(1, tokens + 1, dtype=torch.int32)
    with compiling(monkeypatch, capability) as compiled:
        ragged_logits(q, k, torch.zeros(tokens, HEADS), *causal)
    [kernel] = compiled
    assert kernel.uses(TENSOR_CORES[capability])
    assert kernel.uses("cp.async.cg.shared.global"), "keys are not streamed with 16-byte asynchronous copies"
    assert (kernel.spill_stores, kernel.spill_loads) == (0, 0), kernel.registers


def test_without_the_launch_s_alignment_facts_the_keys_would_load_two_bytes_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the compile goes through the wrapper's real arguments: stripped of Triton's launch specialisation
    (pointer alignment, strides divisible by 16), the same kernel compiles to scalar key loads."""
    from triton.runtime import jit

    def unspecialised(backend: object, arg: object, is_const: bool, specialize: bool, align: bool) -> tuple:
        kind, key = original(backend, arg, is_const, specialize, align)
        return (kind, key) if kind == "constexpr" else (kind, "")

    original = jit.native_specialize_impl
    monkeypatch.setattr("tests.support.kernel_compile.native_specialize_impl", unspecialised)
    q = torch.zeros(2, HEADS, DIM, dtype=torch.bfloat16)
    cache = torch.zeros(16, 64, DIM, dtype=torch.bfloat16)
    tables = torch.arange(16, dtype=torch.int32).view(2, 8)
    with compiling(monkeypatch, 90) as compiled:
        paged_logits(q, cache, torch.zeros(2, HEADS), torch.full((2,), 512), tables)
    [kernel] = compiled
    assert kernel.count("ld.global.b16") >= 64 and not kernel.uses("cp.async.cg.shared.global")
