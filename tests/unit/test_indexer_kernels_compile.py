"""The indexer kernels compile for the GPUs they are for (Hopper sm_90a, Blackwell datacenter sm_100a, Blackwell
workstation sm_120), on this CPU, at DeepSeek V3.2's shapes: their dots run on each architecture's tensor cores,
the decode kernel's page loads are pipelined (asynchronous copies), and nothing spills to local memory.

This is what the CPU can say about the compiled code; whether it is fast is for `make gpu-check` on a GPU.
"""

from __future__ import annotations

import pytest

from tests.support import requires

requires.installed("triton")

from pdfleet.kernels import paged, ragged  # noqa: E402
from tests.support.kernel_compile import compile_for  # noqa: E402

TENSOR_CORES = {90: "wgmma.mma_async", 100: "tcgen05.mma", 120: "mma.sync.aligned"}
V32 = {"HEADS": 64, "DIM": 128, "HEADS_P2": 64, "DIM_P2": 128, "CAST": False}

PAGED_SIGNATURE = {
    "q_ptr": "*bf16", "k_ptr": "*bf16", "w_ptr": "*fp32", "context_ptr": "*i32", "table_ptr": "*i32",
    "out_ptr": "*fp32", "stride_q_row": "i32", "stride_q_head": "i32", "stride_k_page": "i32",
    "stride_k_slot": "i32", "stride_w_row": "i32", "stride_table": "i32", "stride_out_row": "i32",
    "max_pages": "i32",
}
RAGGED_SIGNATURE = {
    "q_ptr": "*bf16", "k_ptr": "*bf16", "w_ptr": "*fp32", "start_ptr": "*i32", "end_ptr": "*i32",
    "tile_lo_ptr": "*i32", "tile_hi_ptr": "*i32", "out_ptr": "*fp32", "stride_q_row": "i32",
    "stride_q_head": "i32", "stride_k_row": "i32", "stride_w_row": "i32", "stride_out_row": "i32",
    "tokens": "i32", "keys": "i32",
}


@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("capability", TENSOR_CORES)
def test_the_decode_kernel_uses_tensor_cores_pipelines_its_page_loads_and_never_spills(capability: int,
                                                                                       next_n: int) -> None:
    compiled = compile_for(paged._paged_logits_body, PAGED_SIGNATURE,
                           {**V32, "NEXT_N": next_n, "NEXT_N_P2": next_n, "PAGE": 64, "PAGES_PER_PROGRAM": 8,
                            "NUM_STAGES": 3}, capability)
    assert compiled.uses(TENSOR_CORES[capability])
    assert compiled.uses("cp.async.commit_group"), "page loads are not pipelined"
    assert (compiled.spill_stores, compiled.spill_loads) == (0, 0)


@pytest.mark.parametrize("capability", TENSOR_CORES)
def test_the_prefill_kernel_uses_tensor_cores_and_never_spills(capability: int) -> None:
    compiled = compile_for(ragged._ragged_logits_body, RAGGED_SIGNATURE,
                           {**V32, "BLOCK_M": 4, "BLOCK_N": 64}, capability, num_warps=8)
    assert compiled.uses(TENSOR_CORES[capability])
    assert (compiled.spill_stores, compiled.spill_loads) == (0, 0)
