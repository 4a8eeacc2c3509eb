"""Preallocation, reproduced: one decode rank has less free KV memory than its peers.

`python -m tests.repro.preallocation SCENARIO_JSON` forks `world` ranks on a real gloo group (as `decode_loop`
does: ledger, catalogue patches, pdfleet's rank instrumentation). Every rank's prealloc queue holds the same
`REQUESTS` requests whose handshakes completed, and runs SGLang 0.5.23's own `DecodePreallocQueue.pop_preallocated`
once, then hands what it popped to SGLang's `DecodeTransferQueue.extend`, as `process_decode_queue` does. The last
rank's KV pool has `TIGHT_FREE` free tokens, its peers' `FREE`: room for 2 of the 3 requests there, all 3 here.

SGLang's own code that runs: `pop_preallocated` whole (the handshake poll `_update_handshake_waiters` with
`poll_and_all_reduce` over the group, the token budget `_allocatable_token_budgets` with `_active_reserved_tokens`
and `_need_space_for_single_req`, `_required_admission_tokens`, the allocator's `prealloc_fits`, the metadata-buffer,
request-slot and Mamba checks), `_pre_alloc` whole (`ReqToTokenPool.alloc`, `alloc_for_decode_prealloc`, which at
page size 1 is `TokenToKVPoolAllocator.alloc`, the `req_to_token` row write, `maybe_hand_to_session`) and
`_send_kv_metadata` (`ReqToMetadataIdxAllocator.alloc`, `_transfer_page_indices`). The pools are SGLang's, built by
their own constructors on the CPU: a `TokenToKVPoolAllocator` (page size 1, as a decode server of page size 1 has),
a `ReqToTokenPool` with its `req_to_token` tensor, and a `RadixCache.create_simulated(disable=True)` (a decode
server without `--disaggregation-decode-enable-radix-cache` has a disabled cache). The requests are SGLang's `Req`.

Stand-ins, and why: the KV receiver (tests.repro.stage's `SlowReceiver`: its handshake has completed; `send_metadata`
records the destination pages and starts the transfer, as no prefill exists to receive them), the KV pool's
buffers (`kvcache=None`: nothing is written into KV on a CPU, only indices are taken), and the scheduler and the
transfer queue as namespaces holding what these methods read (`object.__new__`: their constructors start ZMQ,
CUDA and the model). Each rank writes `rank{N}.json`: the requests it moved to its transfer queue, in order, the
destination pages each was sent, what stays queued, its free tokens and slots, and the collectives it entered
during the call, in order.

With `--loop`, the same pools and requests run in tests.repro.decode_loop's decode loop instead (SGLang's
`ingest_requests`, `process_decode_queue`, `pop_transferred`): the three requests arrive through the request
broadcast into every rank's prealloc queue, and the rank's `stage.build` is equipped (`equip`) so that
`pop_preallocated` is SGLang's own over these pools. The rest of that loop's stand-ins stay (see tests.repro.stage),
among them `resume_retracted_reqs` (nothing is retracted) and the simulated forward, which frees no KV when a
request finishes, so what the pools admit in later iterations is what the first left free.
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from pdfleet.runtime.health import phases
from tests.repro import decode_loop, stage
from tests.repro import scenario as scenario_mod

REQUESTS = 3
PROMPT = 64  # prompt tokens of every request: the pages it is preallocated
MAX_NEW = 36  # with the prompt, 100 tokens of admission budget; 16 more reserved per admitted request
FREE = 400  # room for all three: 400, then 336 - 16, then 272 - 32, each >= 100
TIGHT_FREE = 250  # room for two: 250, then 186 - 16, then 122 - 32 = 90 < 100
RESERVED = 16
SLOTS = 16  # request slots of every rank
CONTEXT = 256  # columns of req_to_token


class _Receiver(stage.SlowReceiver):
    """A KV receiver whose handshake completed (WaitingForInput on its first poll); `send_metadata` is where
    SGLang hands it the preallocated pages: it records them and the transfer begins."""

    def __init__(self, on_abort: Callable[[stage.SlowReceiver], None]) -> None:
        super().__init__(1, on_abort, handshake_polls=1)
        self.supports_host_destination = False
        self.sent: list[int] | None = None

    def send_metadata(self, page_indices: Any, metadata_buffer_index: int, state_indices: Any = None,
                      **_: Any) -> None:
        self.sent = [int(page) for page in page_indices]
        self.start()


def _request(rid: str) -> Any:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=MAX_NEW)
    params.normalize(None)
    req = Req(rid, "", array("q", [7] * PROMPT), params)
    req.bootstrap_room = sum(map(ord, rid))  # read by the handshake poll's failure path only
    return req


def _decode_request(prealloc: Any, rid: str) -> Any:
    """SGLang's `DecodeRequest` for a new `Req` whose handshake completed, bound for `prealloc`'s queue."""
    from sglang.srt.disaggregation.decode import DecodeRequest

    def release_now(receiver: stage.SlowReceiver) -> None:  # no abort in these stories; SGLang's would free it
        prealloc.queue = [d for d in prealloc.queue if d.kv_receiver is not receiver]

    return DecodeRequest(req=_request(rid), kv_receiver=_Receiver(release_now))


def equip(prealloc: Any, transfer: Any, scheduler: Any, *, free: int, group: Any, rank: int) -> None:
    """Give `prealloc` SGLang's pools (`free` free KV tokens) and what `pop_preallocated` reads; SGLang's own
    `pop_preallocated` (patched or not) runs from here on."""
    import torch
    from sglang.srt.disaggregation.utils import ReqToMetadataIdxAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache

    allocator = TokenToKVPoolAllocator(free, torch.bfloat16, "cpu", kvcache=None, need_sort=False)
    vars(scheduler).update(running_batch=SimpleNamespace(reqs=[]), last_batch=None, enable_hisparse=False,
                           enable_lora=False, enable_priority_scheduling=False, enable_decode_hicache=False,
                           disagg_decode_prealloc_queue=prealloc)
    vars(transfer).setdefault("req_to_metadata_buffer_idx_allocator", ReqToMetadataIdxAllocator(64))
    vars(transfer).update(scheduler=scheduler, enable_staging=False)
    vars(prealloc).pop("pop_preallocated", None)  # a stand-in's: SGLang's own from here on
    vars(prealloc).update(
        pending_reqs=[], _prefill_dp_rank_queries={}, pp_size=1, gloo_group=group, tp_rank=rank,
        scheduler=scheduler, transfer_queue=transfer, token_to_kv_pool_allocator=allocator, token_to_kv_pool=None,
        req_to_token_pool=ReqToTokenPool(size=SLOTS, max_context_len=CONTEXT, device="cpu",
                                         enable_memory_saver=False),
        tree_cache=RadixCache.create_simulated(disable=True, mock_allocator=allocator),
        # one allocator for both queues, as SGLang's scheduler builds them
        req_to_metadata_buffer_idx_allocator=transfer.req_to_metadata_buffer_idx_allocator,
        num_reserved_decode_tokens=RESERVED, kv_manager=SimpleNamespace(kv_args=SimpleNamespace(state_types=[])),
        _num_published_destinations=0,
    )


def _free(rank: int, world: int) -> int:
    return TIGHT_FREE if rank == world - 1 else FREE


def build(rank: int, world: int, group: Any) -> tuple[Any, Any]:
    """(prealloc queue, transfer queue) of one rank holding the `REQUESTS` requests, the last rank's KV pool
    the smaller."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue, DecodeTransferQueue

    scheduler = SimpleNamespace(waiting_queue=[], output_streamer=SimpleNamespace(stream_output=_noop),
                                metrics_reporter=SimpleNamespace(enable_metrics=False))
    prealloc = object.__new__(DecodePreallocQueue)
    transfer = object.__new__(DecodeTransferQueue)
    vars(prealloc).update(retracted_queue=[])
    vars(transfer).update(queue=[])
    equip(prealloc, transfer, scheduler, free=_free(rank, world), group=group, rank=rank)
    prealloc.queue = [_decode_request(prealloc, f"req-{i}") for i in range(REQUESTS)]
    return prealloc, transfer


def _noop(*_: Any, **__: Any) -> None:
    return None


def rank_main(sc: scenario_mod.Scenario, rank: int) -> None:
    import torch.distributed as dist

    rank_writer = decode_loop.join(sc, rank)
    applied = decode_loop._apply_patches(sc.patches)
    log = decode_loop.instrument(rank_writer)
    entered: list[str] = []
    mark = log.collective

    def collective(phase: phases.Phase) -> None:  # in order and counted: the PhaseLog keeps a set
        entered.append(phase.label)
        mark(phase)

    log.collective = collective  # type: ignore[method-assign]
    prealloc, transfer = build(rank, sc.world, dist.group.WORLD)
    allocator = prealloc.token_to_kv_pool_allocator
    log.set_loop(phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE)
    preallocated, failed = prealloc.pop_preallocated()  # SGLang's, patched or not
    transfer.extend(preallocated)  # as process_decode_queue hands them on
    log.begin(phases.Phase.LOCAL)
    result = {
        "rank": rank, "applied": applied, "patched": decode_loop._patched_targets(),
        "moved": [d.req.rid for d in transfer.queue],
        "failed": [d.req.rid for d in failed], "still_queued": [d.req.rid for d in prealloc.queue],
        "sent_pages": {d.req.rid: d.kv_receiver.sent for d in transfer.queue},
        "req_to_token_rows": {d.req.rid: prealloc.req_to_token_pool.req_to_token[
            d.req.kv.req_pool_idx, :PROMPT].tolist() for d in transfer.queue},
        "free_tokens": allocator.available_size(), "free_slots": prealloc.req_to_token_pool.available_size(),
        "free_metadata_buffers": prealloc.req_to_metadata_buffer_idx_allocator.available_size(),
        "reader_is_sglangs": "available_size" not in vars(allocator), "collectives_entered": entered,
    }
    sc.result_path(rank).write_text(json.dumps(result))
    dist.barrier()  # every rank has written before any leaves the group
    log.close()


def loop_rank_main(sc: scenario_mod.Scenario, rank: int) -> None:
    """tests.repro.decode_loop's rank, whose `stage.build` equips the prealloc queue with this rank's pools and
    turns the broadcast handshakes into SGLang's requests."""
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

    stage_build = stage.build

    def build_equipped(rank_: int, group: Any, receiver: Any) -> tuple[Any, Any]:
        scheduler, transfer = stage_build(rank_, group, receiver)
        prealloc = scheduler.disagg_decode_prealloc_queue
        equip(prealloc, transfer, scheduler, free=_free(rank_, sc.world), group=group, rank=rank_)
        add_transfer = scheduler.add_transfer

        def add(item: tuple[Any, ...]) -> None:
            if item[0] != stage.HANDSHAKE:
                add_transfer(item)
                return
            decode_req = _decode_request(prealloc, item[1])
            decode_req.req.bootstrap_host = FAKE_BOOTSTRAP_HOST  # SGLang's metadata gate passes the fake backend's
            prealloc.queue.append(decode_req)

        scheduler.add_transfer = add
        return scheduler, transfer

    stage.build = build_equipped  # this rank process only: its loop builds through it
    decode_loop.rank_main(sc, rank)


if __name__ == "__main__":
    main = loop_rank_main if "--loop" in sys.argv[2:] else rank_main
    sys.exit(decode_loop.launch(scenario_mod.Scenario.from_json(sys.argv[1]), rank_fn=main))
