"""The decode retraction decision, reproduced: one rank's KV pool is fuller than its peers'.

`python -m tests.repro.retraction SCENARIO_JSON [--offload] [--tight-from I]` forks `world` ranks on a real gloo
group (as `decode_loop` does: ledger, catalogue patches, pdfleet's rank instrumentation). Each iteration a rank
runs SGLang 0.5.23's `Scheduler.ingest_requests` (the request broadcast) and `Scheduler.update_running_batch`
on its running batch of `REQUESTS` decoding requests, then a simulated forward. From iteration `tight_from` the
last rank's allocator has room for `ROOM` new tokens only (its own memory: fragmentation, pages it holds for a
dropped transfer), its peers' for plenty. SGLang's own code then decides: `ScheduleBatch.check_decode_mem`
(new tokens from the requests' committed lengths, asked of the allocator), `retract_decode` (its order, its
loop until the step fits), the new-token ratio, and, with `--offload` (decode KV offload on), the offload
manager's `drain_before_retraction` and `check_offload_progress` with their all-reduces.

Stand-ins, and why (no KV pool or CUDA state on a CPU): the allocator (`Allocator`: free tokens by rank and
iteration, `check_decode_capacity` compares), `release_req` (there is no KV to free; it returns "retracted",
as with a host backup), the batch's tensor bookkeeping (`filter_batch` keeps the requests it is told to,
`prepare_for_decode` does nothing), and the offload manager's cache controller (no copy is ever in flight).
A retracted request is recorded where `_add_request_to_queue` would queue it.

Each rank writes `rank{N}.json`: the running batch's request ids after each `update_running_batch`, the requests
it retracted, the patches applied and the collectives it entered.
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
from tests.repro import decode_loop, stage
from tests.repro import scenario as scenario_mod

REQUESTS = 4
ROOM = 2  # new tokens the tight rank can place: room for 2 of the 4 requests' next step (page size 1)
PLENTY = 1_000_000
LOOP = phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE


class Allocator:
    """What `check_decode_mem` and `update_running_batch` ask of `token_to_kv_pool_allocator`."""

    page_size = 1

    def __init__(self) -> None:
        self.free = PLENTY

    def available_size(self) -> int:
        return self.free

    def check_decode_capacity(self, num_tokens: int, tree_cache: Any, requests: Any, spec_algorithm: Any) -> bool:
        return num_tokens <= self.free


def _request(rid: str, index: int) -> Any:
    from sglang.srt.sampling.sampling_params import SamplingParams

    return SimpleNamespace(
        rid=rid, beam_group=None, priority=None, output_ids=[0] * (10 + index), origin_input_ids=[0] * 16,
        kv=SimpleNamespace(kv_committed_len=26 + 2 * index), sampling_params=SamplingParams(max_new_tokens=4096),
        finished=lambda: False,
    )


def _batch(allocator: Allocator) -> Any:
    """A real `ScheduleBatch` of `REQUESTS` decoding requests; only its tensor bookkeeping is stood in for."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    batch = object.__new__(ScheduleBatch)
    vars(batch).update(
        reqs=[_request(f"req-{i}", i) for i in range(REQUESTS)], token_to_kv_pool_allocator=allocator,
        tree_cache=SimpleNamespace(req_to_token_pool=SimpleNamespace()), spec_algorithm=SpeculativeAlgorithm.NONE,
        req_to_token_pool=SimpleNamespace(), hisparse_coordinator=None, batch_is_full=False,
    )

    def filter_batch(reqs_to_exclude: Any = None, keep_indices: list[int] | None = None) -> None:
        if keep_indices is None:
            excluded = reqs_to_exclude or []
            keep_indices = [i for i, r in enumerate(batch.reqs) if not r.finished() and r not in excluded]
        batch.reqs = [batch.reqs[i] for i in keep_indices]

    vars(batch).update(filter_batch=filter_batch, prepare_for_decode=lambda: None,
                       release_req=lambda idx, remaining, offload_kv=True: True)
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
               retracted: list[str]) -> Any:
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
    )
    scheduler.metrics_reporter = SimpleNamespace(**vars(scheduler.metrics_reporter), num_retracted_reqs=0)
    return scheduler


def run_loop(sc: scenario_mod.Scenario, rank: int, group: Any, rank_writer: seams.Writer, *, offload: bool,
             tight_from: int) -> dict[str, Any]:
    receiver = stage.BroadcastReceiver(rank, group, rank_writer, inbox=list)
    allocator = Allocator()
    retracted: list[str] = []
    scheduler = _scheduler(rank, group, receiver, allocator, offload, retracted)
    batch = _batch(allocator)
    batches: list[list[str]] = []
    iteration_ns: list[int] = []  # each iteration's wall time on this rank (tests.repro.overhead reads it)
    rank_writer.set_loop(LOOP)
    for iteration in range(sc.iterations):
        started_ns = time.perf_counter_ns()
        scheduler.ingest_requests()  # SGLang's: the request broadcast (its seam steps the iteration)
        tight = rank == sc.world - 1 and iteration >= tight_from
        allocator.free = ROOM if tight else PLENTY
        batch = scheduler.update_running_batch(batch)  # SGLang's: check_decode_mem, drain, retract_decode
        batches.append([req.rid for req in batch.reqs])
        rank_writer.begin(phases.Phase.FORWARD)
        time.sleep(sc.forward_s)
        for req in batch.reqs:
            req.kv.kv_committed_len += 1
            req.output_ids.append(0)
        scheduler.forward_ct += 1
        iteration_ns.append(time.perf_counter_ns() - started_ns)
    return {"rank": rank, "iterations": sc.iterations, "iteration_ns": iteration_ns, "batches": batches,
            "retracted": retracted}


def rank_main(sc: scenario_mod.Scenario, rank: int, *, offload: bool, tight_from: int) -> None:
    import torch.distributed as dist

    rank_writer = decode_loop.join(sc, rank)
    applied = decode_loop._apply_patches(sc.patches)
    log = decode_loop.instrument(rank_writer)
    result = run_loop(sc, rank, dist.group.WORLD, log, offload=offload, tight_from=tight_from)
    result.update(applied=applied, collectives_entered=log.labels())
    sc.result_path(rank).write_text(json.dumps(result))
    log.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("--offload", action="store_true", help="decode KV offload on (its drain all-reduces)")
    parser.add_argument("--tight-from", type=int, default=2, help="the iteration the last rank's pool fills")
    args = parser.parse_args(argv)
    sc = scenario_mod.Scenario.from_json(args.scenario)
    return decode_loop.launch(sc, rank_fn=lambda s, rank: rank_main(s, rank, offload=args.offload,
                                                                     tight_from=args.tight_from))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
