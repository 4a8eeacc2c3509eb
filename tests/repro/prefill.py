"""The prefill side of the reproduction: one rank's SGLang prefill objects and its loop.

The loop follows `SchedulerDisaggregationPrefillMixin.event_loop_normal_disagg_prefill` in SGLang 0.5.23:
`ingest_requests` (request broadcast), `PrefillBootstrapQueue.pop_bootstrapped` (bootstrap poll, with its
`if len(self.queue) == 0: return []` guard), a batch (forward) or `on_idle`, then
`process_disagg_prefill_inflight_queue` (the KV-transfer poll, with its `if len(...) == 0: return []` guard).
Those three steps, `Scheduler.abort_request`, `handle_bootstrap_failure`, `handle_inflight_transfer_failure`,
`poll_and_all_reduce_attn_cp_tp_group`, `release_kv_cache`, `prepare_abort` and the metadata allocator are
SGLang's own code; the forward is simulated (a pause, after which the batch's requests are in flight, as
`process_batch_result_disagg_prefill` leaves them once their last chunk is sent).

Stand-ins, and why (their constructors allocate KV pools, ZMQ sockets and CUDA state): the scheduler and the
bootstrap queue are made with `object.__new__` and given the attributes these methods read; the bootstrap
queue admits no request before its bootstrap completes (`can_prefill_before_bootstrap` is False: no optimistic
prefill) and `finalize_bootstrap` succeeds (no metadata buffers to bind); the tree cache frees nothing (the
requests hold no KV on a CPU). The KV sender is `stage.SlowReceiver` (bootstrap, then transfer, as KVPoll
states); its `abort()` carries the injected fault: it releases the request from this rank's queue at once,
instead of letting SGLang's MIN poll retire it on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from tests.repro import scenario as scenario_mod
from tests.repro import stage

LOOP = phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_PREFILL


def _noop(*_: Any, **__: Any) -> None:
    return None


def singleton_groups(rank: int, world: int) -> Any:
    """This rank's attention-CP group when CP is 1: a group of itself (every rank must create every group)."""
    import torch.distributed as dist

    groups = [dist.new_group([r], backend="gloo") for r in range(world)]
    return groups[rank]


def new_request(rid: str, sender: stage.SlowReceiver) -> Any:
    """The fields of `Req` that the prefill queues, their failure paths and `release_kv_cache` read."""
    req = stage.new_request(rid)
    vars(req).update(
        disagg_kv_sender=sender, pending_bootstrap=False, is_retracted=False, prefill_attempt_count=0,
        metadata_buffer_index=-1, return_routed_experts=False, session=None, lock=None,
        kv=SimpleNamespace(holds_kv=False, holds_mamba=False, is_kv_released=True),
        release_mm_inputs_on_abort=_noop,
    )
    vars(req.time_stats).update(set_prefill_kv_transfer_finish_time=_noop, set_completion_time=_noop,
                                trace_ctx=SimpleNamespace(abort=_noop))
    return req


def build(rank: int, tp_group: Any, cp_group: Any, receiver: Any) -> Any:
    """The prefill scheduler of one rank; its bootstrap queue is `disagg_prefill_bootstrap_queue`."""
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    from sglang.srt.disaggregation.utils import DisaggregationMode, ReqToMetadataIdxAllocator
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.scheduler import Scheduler

    scheduler = object.__new__(Scheduler)
    bootstrap = object.__new__(PrefillBootstrapQueue)
    tree_cache = SimpleNamespace(supports_mamba=lambda: True, finish=_noop)
    vars(scheduler).update(
        stage.intake_attributes(receiver), disaggregation_mode=DisaggregationMode.PREFILL,
        disagg_prefill_bootstrap_queue=bootstrap, disagg_prefill_inflight_queue=[],
        disagg_prefill_pending_chunk_rids=set(), tree_cache=tree_cache, attn_tp_cpu_group=tp_group,
        attn_cp_cpu_group=cp_group, req_to_metadata_buffer_idx_allocator=ReqToMetadataIdxAllocator(64),
        processed_tokens_counter=0,
    )
    vars(bootstrap).update(
        queue=[], pp_size=1, scheduler=scheduler, scheduler_stage_metrics=None,
        can_prefill_before_bootstrap=lambda req: False, finalize_bootstrap=lambda req: True,
    )
    handlers: dict[type, Callable[[Any], Any]] = {AbortReq: lambda r: scheduler.abort_request(r)}
    scheduler._request_dispatcher = lambda r: handlers.get(type(r), lambda item: _arrive(scheduler, *item))(r)
    return scheduler


def _arrive(scheduler: Any, kind: str, rid: str, polls: int) -> None:
    """A request arrives in the bootstrap queue (on every rank: it came in the broadcast). `kind` is
    `stage.HANDSHAKE` for one whose bootstrap takes `polls` polls (its KV then lands in one), or `transfer`
    for one bootstrapped in one poll whose KV lands `polls` polls after its prefill."""
    def release_now(sender: stage.SlowReceiver) -> None:
        bootstrap = scheduler.disagg_prefill_bootstrap_queue
        bootstrap.queue = [r for r in bootstrap.queue if r.disagg_kv_sender is not sender]
        inflight = scheduler.disagg_prefill_inflight_queue
        scheduler.disagg_prefill_inflight_queue = [r for r in inflight if r.disagg_kv_sender is not sender]

    handshake, transfer = (polls, 1) if kind == stage.HANDSHAKE else (1, polls)
    sender = stage.SlowReceiver(transfer, release_now, handshake_polls=handshake)
    scheduler.disagg_prefill_bootstrap_queue.queue.append(new_request(rid, sender))


def inbox(sc: scenario_mod.Scenario, iteration: int) -> list[tuple[Any, ...]]:
    """What rank 0 broadcasts this iteration: `arrivals` (quick bootstrap, slow transfer), then `handshakes`
    (slow bootstrap)."""
    transfers = [("transfer", rid, polls) for rid, polls in sc.arrivals.get(iteration, [])]
    return [*transfers, *[(stage.HANDSHAKE, rid, polls) for rid, polls in sc.handshakes.get(iteration, [])]]


def run_loop(sc: scenario_mod.Scenario, rank: int, group: Any, rank_writer: seams.Writer) -> dict[str, Any]:
    """The prefill loop for `sc.iterations` iterations; returns what happened to each request, by iteration."""
    from sglang.srt.managers.io_struct import AbortReq

    iteration = 0
    receiver = stage.BroadcastReceiver(rank, group, rank_writer, inbox=lambda: inbox(sc, iteration))
    scheduler = build(rank, group, singleton_groups(rank, sc.world), receiver)
    bootstrap = scheduler.disagg_prefill_bootstrap_queue
    signals = sc.local_aborts.get(rank, {})
    events: dict[str, dict[str, int]] = {"dropped": {}, "prefilled": {}, "transferred": {}}
    rank_writer.set_loop(LOOP)
    for iteration in range(sc.iterations):
        held = {r.rid for r in [*bootstrap.queue, *scheduler.disagg_prefill_inflight_queue]}
        scheduler.ingest_requests()  # SGLang's; its seam steps the iteration
        if iteration in signals:  # a rank-local abort decision (a per-rank clock, a local error handler)
            scheduler.abort_request(AbortReq(rid=signals[iteration]))
        scheduler.waiting_queue.extend(bootstrap.pop_bootstrapped())  # SGLang: guard, then the bootstrap poll
        rank_writer.begin(phases.Phase.LOCAL)
        batch, scheduler.waiting_queue = scheduler.waiting_queue, []
        if batch:
            rank_writer.begin(phases.Phase.FORWARD)
            time.sleep(sc.forward_s)
            for req in batch:  # the last chunk is sent: the transfer is in flight
                req.disagg_kv_sender.start()
                events["prefilled"][req.rid] = iteration
            scheduler.disagg_prefill_inflight_queue.extend(batch)
        else:
            rank_writer.begin(phases.Phase.IDLE)
            time.sleep(sc.idle_s)
        for req in scheduler.process_disagg_prefill_inflight_queue():  # SGLang: guard, then the transfer poll
            events["dropped" if _aborted(req) else "transferred"].setdefault(req.rid, iteration)
        rank_writer.begin(phases.Phase.LOCAL)
        now_held = {r.rid for r in [*bootstrap.queue, *scheduler.disagg_prefill_inflight_queue]}
        arrived = {rid for rid, _ in [*sc.arrivals.get(iteration, []), *sc.handshakes.get(iteration, [])]}
        for rid in (held | arrived) - now_held - set(events["transferred"]):
            events["dropped"].setdefault(rid, iteration)
    return {"rank": rank, "iterations": sc.iterations, **events}


def _aborted(req: Any) -> bool:
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return isinstance(req.finished_reason, FINISH_ABORT)
