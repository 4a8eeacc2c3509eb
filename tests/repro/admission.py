"""Resuming retracted requests, reproduced: one decode rank has less free KV memory than its peers.

`python -m tests.repro.admission SCENARIO_JSON` forks `world` ranks on a real gloo group (as `decode_loop` does:
ledger, catalogue patches, pdfleet's rank instrumentation). Every rank holds the same `RETRACTED` retracted
requests (as retraction-consensus leaves them) and runs SGLang 0.5.23's own
`DecodePreallocQueue.resume_retracted_reqs` once: its token budget (`_allocatable_token_budgets`,
`_prealloc_required_tokens`, the allocator's `prealloc_fits`), request slots and loop. The last rank's KV pool
has `TIGHT_FREE` free tokens, its peers' `FREE`: room for 2 of the 3 requests there, for all 3 here.

SGLang's own objects, built without their GPU-bound constructors: the KV allocator is a
`PagedTokenToKVPoolAllocator` (page size 1) whose free pages are a CPU tensor, the request slots a
`ReqToTokenPool` whose free slots are a list, the metadata buffers SGLang's `ReqToMetadataIdxAllocator`.
Stand-ins: `_pre_alloc` takes the request's pages and a slot from those pools (no KV is written on a CPU), and
`restore_kv_cache` does nothing (no host backup to copy from). Each rank writes `rank{N}.json`: the requests
it resumed, in order, the patches applied and the collectives it entered.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

from pdfleet.runtime.health import phases
from tests.repro import decode_loop
from tests.repro import scenario as scenario_mod

RETRACTED = 3
FREE = 400  # tokens: each request needs 100 (64 prompt + 36 generated) plus 16 reserved for decoding
TIGHT_FREE = 250
RESERVED = 16


def _request(rid: str) -> Any:
    from sglang.srt.sampling.sampling_params import SamplingParams

    return SimpleNamespace(rid=rid, origin_input_ids=[0] * 64, output_ids=[0] * 37, is_retracted=True,
                           sampling_params=SamplingParams(max_new_tokens=512),
                           kv=SimpleNamespace(holds_mamba=False))


def build(rank: int, world: int, group: Any, *, tight: bool = True) -> Any:
    """The rank's prealloc queue with its pools and retracted requests (with `tight`, the last rank's pool is
    the smaller)."""
    import torch
    from sglang.srt.disaggregation.decode import DecodePreallocQueue
    from sglang.srt.disaggregation.utils import ReqToMetadataIdxAllocator
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    free = TIGHT_FREE if tight and rank == world - 1 else FREE
    allocator = object.__new__(PagedTokenToKVPoolAllocator)
    vars(allocator).update(page_size=1, free_pages=torch.arange(1, free + 1, dtype=torch.int64),
                           num_staged_pages=0)
    slots = object.__new__(ReqToTokenPool)
    slots.free_slots = list(range(1, 64))
    queue = object.__new__(DecodePreallocQueue)
    vars(queue).update(
        retracted_queue=[_request(f"req-{i}") for i in range(RETRACTED)], queue=[], pp_size=1, gloo_group=group,
        tp_rank=rank, token_to_kv_pool_allocator=allocator, req_to_token_pool=slots, token_to_kv_pool=object(),
        req_to_metadata_buffer_idx_allocator=ReqToMetadataIdxAllocator(64), tree_cache=None,
        num_reserved_decode_tokens=RESERVED, transfer_queue=SimpleNamespace(queue=[]),
        scheduler=SimpleNamespace(running_batch=SimpleNamespace(reqs=[]), waiting_queue=[], last_batch=None,
                                  enable_hisparse=False, enable_overlap=False),
    )

    def pre_alloc(req: Any) -> None:  # SGLang's takes the pages and a slot, and writes the KV (not on a CPU)
        need = queue._pre_alloc_fill_len(req)
        allocator.free_pages = allocator.free_pages[need:]
        slots.free_slots.pop()

    queue._pre_alloc = pre_alloc
    return queue


def run_loop(sc: scenario_mod.Scenario, rank: int, group: Any, rank_writer: Any) -> dict[str, Any]:
    """`sc.iterations` resumptions from fresh pools where every rank has room for all (tests.repro.overhead's
    `resuming` workload: the agreement's cost per call, nothing diverging); each iteration's time and what it
    resumed."""
    import time

    import torch.distributed as dist
    from sglang.srt.disaggregation import decode

    decode.restore_kv_cache = lambda *args, **kwargs: None
    rank_writer.set_loop(phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE)
    iteration_ns, resumed = [], []
    for _ in range(sc.iterations):
        queue = build(rank, sc.world, group, tight=False)
        dist.barrier(group)  # aligned, as in a real loop: the untimed rebuild's skew stays out of the figure
        rank_writer.step()
        started_ns = time.perf_counter_ns()
        resumed.append([req.rid for req in queue.resume_retracted_reqs()])
        iteration_ns.append(time.perf_counter_ns() - started_ns)
        rank_writer.begin(phases.Phase.LOCAL)
    return {"rank": rank, "iterations": sc.iterations, "iteration_ns": iteration_ns, "resumed": resumed}


def rank_main(sc: scenario_mod.Scenario, rank: int) -> None:
    import torch.distributed as dist
    from sglang.srt.disaggregation import decode

    rank_writer = decode_loop.join(sc, rank)
    applied = decode_loop._apply_patches(sc.patches)
    log = decode_loop.instrument(rank_writer)
    decode.restore_kv_cache = lambda *args, **kwargs: None  # no host backup to copy from on a CPU
    queue = build(rank, sc.world, dist.group.WORLD)
    log.set_loop(phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE)
    resumed = queue.resume_retracted_reqs()  # SGLang's, patched or not
    log.begin(phases.Phase.LOCAL)
    result = {"rank": rank, "resumed": [req.rid for req in resumed],
              "still_retracted": [req.rid for req in queue.retracted_queue],
              "free_tokens": queue.token_to_kv_pool_allocator.available_size(),
              "applied": applied, "collectives_entered": log.labels()}
    sc.result_path(rank).write_text(json.dumps(result))
    dist.barrier()  # every rank has written before any leaves the group
    log.close()


if __name__ == "__main__":
    sys.exit(decode_loop.launch(scenario_mod.Scenario.from_json(sys.argv[1]), rank_fn=rank_main))
