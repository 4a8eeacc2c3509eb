"""The decode retraction decision, reproduced: one rank's KV pool is fuller than its peers'.

`python -m tests.repro.retraction SCENARIO_JSON [--offload] [--host-pool] [--tight-from I]` forks `world` ranks on
a real gloo group (as `decode_loop` does: ledger, catalogue patches, pdfleet's rank instrumentation). Each
iteration a rank runs SGLang 0.5.23's `Scheduler.ingest_requests` (the request broadcast) and
`Scheduler.update_running_batch` on its running batch of `REQUESTS` decoding requests, then a simulated forward.
From iteration `tight_from` the last rank's allocator has room for `ROOM` new tokens only (its own memory:
fragmentation, pages it holds for a dropped transfer), its peers' for plenty. SGLang's own code then decides:
`ScheduleBatch.check_decode_mem` (new tokens from the requests' committed lengths, asked of the allocator),
`retract_decode` (its order, its loop until the step fits), the new-token ratio, and, with `--offload` (decode KV
offload on), the offload manager's `drain_before_retraction` and `check_offload_progress` with their all-reduces.

With `--host-pool` (the retraction backup SGLang picks for an MHA decode server) every rank's allocator is tight
from `tight_from`, so the ranks agree what to retract even without a patch, and each retracted request is backed
up to the rank's own host pool by SGLang's `ScheduleBatch.release_req` / `release_req` / `backup_kv_cache` /
`UnifiedRadixCache.backup_kv_cache` (tests.repro.host_backup): the last rank's pool has `TIGHT_HOST_SLOTS`
slots (room for the first retracted request's KV, not the second's), its peers' `HOST_SLOTS` (room for both).
`retract_decode` aborts a request whose backup failed; the abort goes out through SGLang's `send_abort_output`.

Stand-ins, and why (no KV pool or CUDA state on a CPU): the allocator (`Allocator`: free tokens by rank and
iteration, `check_decode_capacity` compares), `release_req` without `--host-pool` (there is no KV to free; it returns
"retracted", as with a host backup), the batch's tensor bookkeeping (`filter_batch` keeps the requests it is told to,
`prepare_for_decode` does nothing), and the offload manager's cache controller (no copy is ever in flight).
A retracted request is recorded where `_add_request_to_queue` would queue it, an aborted one where the
tokenizer would be told.

Each rank writes `rank{N}.json`: the running batch's request ids after each `update_running_batch`, the requests
it retracted and aborted, with `--host-pool` its host pool's size, free slots after each iteration and the slots
its retracted requests' backups hold, the patches applied and the collectives it entered.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
from types import SimpleNamespace
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from tests.repro import decode_loop, host_backup, stage
from tests.repro import scenario as scenario_mod

REQUESTS = 4
ROOM = 2  # new tokens the tight rank can place: room for 2 of the 4 requests' next step (page size 1)
PLENTY = 1_000_000
# A retracted request's backup takes seqlen - 1 host slots: 27 and 28 for the two retracted at iteration 2.
HOST_SLOTS = 64
TIGHT_HOST_SLOTS = 40
LOOP = phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE


class Allocator:
    """What `check_decode_mem` and `update_running_batch` ask of `token_to_kv_pool_allocator`."""

    page_size = 1

    def __init__(self, kvcache: Any = None) -> None:
        self.free = PLENTY
        self.kvcache = kvcache

    def get_kvcache(self) -> Any:
        return self.kvcache

    def available_size(self) -> int:
        return self.free

    def check_decode_capacity(self, num_tokens: int, tree_cache: Any, requests: Any, spec_algorithm: Any) -> bool:
        return num_tokens <= self.free


class _Request(SimpleNamespace):
    """The fields of `Req` that the decode step, retraction and an abort read."""

    @property
    def seqlen(self) -> int:  # as Req's
        return len(self.origin_input_ids) + len(self.output_ids)

    def reset_for_retract(self) -> None:  # Req's also clears KV bookkeeping these fakes do not have
        self.is_retracted = True


def _request(rid: str, index: int) -> Any:
    from sglang.srt.sampling.sampling_params import SamplingParams

    return _Request(
        rid=rid, beam_group=None, priority=None, output_ids=[0] * (10 + index), origin_input_ids=[0] * 16,
        kv=SimpleNamespace(kv_committed_len=26 + 2 * index, req_pool_idx=index, holds_kv=True,
                           retraction_backup=None),
        sampling_params=SamplingParams(max_new_tokens=4096), finished=lambda: False, is_retracted=False,
        to_finish=None, weight_version_events=[],
    )


def _batch(allocator: Allocator, tree_cache: Any = None) -> Any:
    """A real `ScheduleBatch` of `REQUESTS` decoding requests; only its tensor bookkeeping is stood in for, and
    `release_req` unless `tree_cache` (a host-backup radix cache, tests.repro.host_backup) is given."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    batch = object.__new__(ScheduleBatch)
    if tree_cache is None:
        tree_cache = SimpleNamespace(req_to_token_pool=SimpleNamespace())
        batch.release_req = lambda idx, remaining, offload_kv=True: True
    vars(batch).update(
        reqs=[_request(f"req-{i}", i) for i in range(REQUESTS)], token_to_kv_pool_allocator=allocator,
        tree_cache=tree_cache, spec_algorithm=SpeculativeAlgorithm.NONE,
        req_to_token_pool=tree_cache.req_to_token_pool, hisparse_coordinator=None, batch_is_full=False,
    )

    def filter_batch(reqs_to_exclude: Any = None, keep_indices: list[int] | None = None) -> None:
        if keep_indices is None:
            excluded = reqs_to_exclude or []
            keep_indices = [i for i, r in enumerate(batch.reqs) if not r.finished() and r not in excluded]
        batch.reqs = [batch.reqs[i] for i in keep_indices]

    vars(batch).update(filter_batch=filter_batch, prepare_for_decode=lambda: None)
    return batch


def _offload_manager(group: Any) -> Any:
    """SGLang's `DecodeKVCacheOffloadManager`, its all-reduces over `group` (the scheduler's dp-TP CPU group)."""
    import torch.distributed as dist
    from sglang.srt.disaggregation.decode_kvcache_offload_manager import DecodeKVCacheOffloadManager

    manager = object.__new__(DecodeKVCacheOffloadManager)
    vars(manager).update(
        tp_group=group, tp_world_size=dist.get_world_size(group), ongoing_offload={}, offload_inflight=set(),
        cache_controller=SimpleNamespace(ack_write_queue=[], ack_backup_queue=queue.Queue()),
        ongoing_backup={},
    )
    return manager


def _scheduler(rank: int, group: Any, receiver: Any, allocator: Allocator, offload: bool,
               retracted: list[str], aborted: list[str]) -> Any:
    from sglang.srt.managers.scheduler import Scheduler

    scheduler = object.__new__(Scheduler)
    vars(scheduler).update(
        stage.intake_attributes(receiver), _request_dispatcher=lambda r: None, dp_tp_cpu_group=group,
        enable_skip_finishing_decode=False, result_queue=[], forward_ct=0, token_to_kv_pool_allocator=allocator,
        tree_cache=SimpleNamespace(req_to_token_pool=SimpleNamespace()),
        new_token_ratio_tracker=SimpleNamespace(current=0.7, decay_step=lambda: None),
        beam_coordinator=SimpleNamespace(retire_group=lambda req: None),
        decode_offload_manager=_offload_manager(group) if offload else None,
        _add_request_to_queue=lambda req, is_retracted=False: retracted.append(req.rid),
        rust_server=None,  # send_abort_output then hands the abort to the tokenizer channel: recorded here
        ipc_channels=SimpleNamespace(send_to_tokenizer=SimpleNamespace(
            send_output=lambda abort, req: aborted.append(abort.rid))),
    )
    scheduler.metrics_reporter = SimpleNamespace(**vars(scheduler.metrics_reporter), num_retracted_reqs=0)
    return scheduler


def run_loop(sc: scenario_mod.Scenario, rank: int, group: Any, rank_writer: seams.Writer, *, offload: bool,
             tight_from: int, host_pool: bool = False) -> dict[str, Any]:
    receiver = stage.BroadcastReceiver(rank, group, rank_writer, inbox=list)
    host_slots = TIGHT_HOST_SLOTS if rank == sc.world - 1 else HOST_SLOTS
    device_pool, host, tree_cache = host_backup.build(REQUESTS, host_slots) if host_pool else (None, None, None)
    allocator = Allocator(device_pool)
    retracted: list[str] = []
    aborted: list[str] = []
    scheduler = _scheduler(rank, group, receiver, allocator, offload, retracted, aborted)
    batch = _batch(allocator, tree_cache)
    retracted_reqs: list[Any] = []
    if host_pool:  # the requests themselves, to read back the backups they hold
        scheduler._add_request_to_queue = lambda req, is_retracted=False: (retracted.append(req.rid),
                                                                           retracted_reqs.append(req))
    host_free: list[int] = []
    batches: list[list[str]] = []
    iteration_ns: list[int] = []  # each iteration's wall time on this rank (tests.repro.overhead reads it)
    rank_writer.set_loop(LOOP)
    for iteration in range(sc.iterations):
        started_ns = time.perf_counter_ns()
        scheduler.ingest_requests()  # SGLang's: the request broadcast (its seam steps the iteration)
        tight = (host_pool or rank == sc.world - 1) and iteration >= tight_from
        allocator.free = ROOM if tight else PLENTY
        batch = scheduler.update_running_batch(batch)  # SGLang's: check_decode_mem, drain, retract_decode
        batches.append([req.rid for req in batch.reqs])
        rank_writer.begin(phases.Phase.FORWARD)
        time.sleep(sc.forward_s)
        for req in batch.reqs:
            req.kv.kv_committed_len += 1
            req.output_ids.append(0)
        scheduler.forward_ct += 1
        if host is not None:
            host_free.append(host.available_size())
        iteration_ns.append(time.perf_counter_ns() - started_ns)
    result = {"rank": rank, "iterations": sc.iterations, "iteration_ns": iteration_ns, "batches": batches,
              "retracted": retracted, "aborted": aborted}
    if host is not None:
        result.update(host_slots=host_slots, host_free=host_free, host_held=sum(
            len(req.kv.retraction_backup.host_indices) for req in retracted_reqs if req.kv.retraction_backup))
    return result


def rank_main(sc: scenario_mod.Scenario, rank: int, *, offload: bool, tight_from: int, host_pool: bool) -> None:
    import contextlib

    import torch.distributed as dist
    from sglang.srt.runtime_context import get_disagg

    rank_writer = decode_loop.join(sc, rank)
    applied = decode_loop._apply_patches(sc.patches)
    log = decode_loop.instrument(rank_writer)
    backup = contextlib.nullcontext()
    if host_pool:
        host_backup.install_release_stand_in()
        backup = get_disagg().override(disaggregation_decode_retraction_backup="host_pool")
    with backup:
        result = run_loop(sc, rank, dist.group.WORLD, log, offload=offload, tight_from=tight_from,
                          host_pool=host_pool)
    result.update(applied=applied, collectives_entered=log.labels())
    sc.result_path(rank).write_text(json.dumps(result))
    log.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("--offload", action="store_true", help="decode KV offload on (its drain all-reduces)")
    parser.add_argument("--host-pool", action="store_true",
                        help="host-pool retraction backup: every rank's KV pool fills, the last rank's host pool "
                             "is the smaller")
    parser.add_argument("--tight-from", type=int, default=2, help="the iteration the last rank's pool fills")
    args = parser.parse_args(argv)
    sc = scenario_mod.Scenario.from_json(args.scenario)
    return decode_loop.launch(sc, rank_fn=lambda s, rank: rank_main(s, rank, offload=args.offload,
                                                                     tight_from=args.tight_from,
                                                                     host_pool=args.host_pool))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
