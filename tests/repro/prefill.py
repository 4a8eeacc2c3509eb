"""The prefill side of the reproduction: one rank's SGLang prefill objects and its loop.

The loop follows `SchedulerDisaggregationPrefillMixin.event_loop_normal_disagg_prefill` in SGLang 0.5.23:
`ingest_requests` (request broadcast), `PrefillBootstrapQueue.pop_bootstrapped` (bootstrap poll, with its
`if len(self.queue) == 0: return []` guard), `get_next_disagg_prefill_batch_to_run` (`process_pending_chunked_abort`,
`resolve_waiting_queue_bootstrap` with its `if not candidates: return` guard in front of the waiting queue's
bootstrap poll, `process_prefill_chunk` with its `if self.chunked_req is not None` gate in front of
`check_bootstrap`'s poll, then admission), a batch (forward) or `on_idle`, then
`process_disagg_prefill_inflight_queue` (the KV-transfer poll, with its `if len(...) == 0: return []` guard).
Those steps, `Scheduler.abort_request`, `handle_bootstrap_failure`, `handle_pending_bootstrap`,
`handle_inflight_transfer_failure`, `release_aborted_prefill_waiting_req`, `poll_and_all_reduce_attn_cp_tp_group`,
`release_kv_cache`, `checkpoint_kv_cache`, `prepare_abort`, `ensure_metadata_buffer` and the metadata allocator
are SGLang's own code; the forward is simulated (a pause, after which the batch's requests are in flight, as
`process_batch_result_disagg_prefill` leaves them once their last chunk is sent; the chunked request's next
chunk runs in the next batch).

Stand-ins, and why (their constructors allocate KV pools, ZMQ sockets and CUDA state): the scheduler and the
bootstrap queue are made with `object.__new__` and given the attributes these methods read;
`finalize_bootstrap` clears the pending flag and succeeds (no metadata buffers to bind); the tree cache frees
nothing (the requests hold no KV on a CPU); HiCache events and the DP-attention batch sync do nothing (neither
is configured). Admission (`get_new_batch_prefill`, whose `PrefillAdder` budgets KV pages) is `_admit`: the same
rule on every rank. It admits every waiting request except a `HELD` one (as if its prompt never fit the free
pages), and a `CHUNKED` one becomes the chunked request and stays it (its prompt needs more chunks than the run
has iterations). Only those two kinds are prefilled before their bootstrap completes (optimistic prefill,
`can_prefill_before_bootstrap`); any other request waits in the bootstrap queue until it completes. The KV
sender is `stage.SlowReceiver` (bootstrap, then transfer, as KVPoll states); its `abort()` carries the injected
fault: it releases the request from this rank's bootstrap and inflight queues at once, instead of letting
SGLang's MIN poll retire it on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from tests.repro import prefill_admission, rank_hooks, stage
from tests.repro import scenario as scenario_mod

LOOP = phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_PREFILL
# Kinds of optimistic request, by rid prefix (a handshake's rid: its bootstrap takes that many polls).
HELD = "held-"  # admission never takes it: it waits in the waiting queue, polled by resolve_waiting_queue_bootstrap
CHUNKED = "chunked-"  # admitted as the chunked request and chunked for the rest of the run, polled by check_bootstrap


def _noop(*_: Any, **__: Any) -> None:
    return None


def singleton_groups(rank: int, world: int) -> Any:
    """This rank's attention-CP group when CP is 1: a group of itself (every rank must create every group)."""
    import torch.distributed as dist

    groups = [dist.new_group([r], backend="gloo") for r in range(world)]
    return groups[rank]


class Req(SimpleNamespace):
    """A request compared by identity, as SGLang's `Req` is (its queues keep sets of requests)."""

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other


def new_request(rid: str, sender: stage.SlowReceiver) -> Any:
    """The fields of `Req` that the prefill queues, their failure paths and `release_kv_cache` read."""
    req = Req(**vars(stage.new_request(rid)))
    vars(req).update(
        disagg_kv_sender=sender, pending_bootstrap=True, is_retracted=False, prefill_attempt_count=0,
        metadata_buffer_index=-1, return_routed_experts=False, session=None, lock=None,
        kv=SimpleNamespace(holds_kv=False, holds_mamba=False, is_kv_released=True),
        release_mm_inputs_on_abort=_noop, discard_output_reason=None, skip_radix_cache_insert=False,
        extend_end=0, prefix_len=0, output_ids=[], weight_version_events=[],
        finished=lambda: req.finished_reason is not None,
    )
    vars(req.time_stats).update(set_prefill_kv_transfer_finish_time=_noop, set_completion_time=_noop,
                                trace_ctx=SimpleNamespace(abort=_noop))
    return req


def build(rank: int, tp_group: Any, cp_group: Any, receiver: Any,
          metadata_slots: int = scenario_mod.METADATA_SLOTS, kv_free: int | None = None) -> Any:
    """The prefill scheduler of one rank; its bootstrap queue is `disagg_prefill_bootstrap_queue`, with
    `metadata_slots` free metadata buffers. With `kv_free`, admission is SGLang's own over a KV pool with that
    many free tokens, and the requests are SGLang's `Req` (tests/repro/prefill_admission.py)."""
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    from sglang.srt.disaggregation.utils import DisaggregationMode, ReqToMetadataIdxAllocator
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.scheduler import Scheduler

    scheduler = object.__new__(Scheduler)
    bootstrap = object.__new__(PrefillBootstrapQueue)
    tree_cache = SimpleNamespace(supports_mamba=lambda: True, finish=_noop, checkpoint=_noop)
    metadata = ReqToMetadataIdxAllocator(metadata_slots)
    vars(scheduler).update(
        stage.intake_attributes(receiver), disaggregation_mode=DisaggregationMode.PREFILL,
        disagg_prefill_bootstrap_queue=bootstrap, disagg_prefill_inflight_queue=[],
        disagg_prefill_pending_chunk_rids=set(), tree_cache=tree_cache, attn_tp_cpu_group=tp_group,
        attn_cp_cpu_group=cp_group, req_to_metadata_buffer_idx_allocator=metadata, processed_tokens_counter=0,
        _pending_chunked_abort_req=None, enable_overlap=False, _process_hicache_events=_noop,
        beam_coordinator=SimpleNamespace(retire_group=_noop),
        ipc_channels=SimpleNamespace(send_to_tokenizer=SimpleNamespace(send_output=_noop)),
        dp_attn_adapter=SimpleNamespace(maybe_prepare_mlp_sync_batch=lambda batch: batch),
        get_new_batch_prefill=lambda running_batch: _admit(scheduler, running_batch),
    )
    vars(bootstrap).update(
        queue=[], pp_size=1, scheduler=scheduler, scheduler_stage_metrics=None,
        req_to_metadata_buffer_idx_allocator=metadata,
        can_prefill_before_bootstrap=lambda req: req.rid.startswith((HELD, CHUNKED)), finalize_bootstrap=_finalize,
    )
    make = new_request
    if kv_free is not None:
        prefill_admission.equip(scheduler, kv_free)

        def make(rid: str, sender: stage.SlowReceiver) -> Any:
            return prefill_admission.real_request(rid, vars(new_request(rid, sender)))

    handlers: dict[type, Callable[[Any], Any]] = {AbortReq: lambda r: scheduler.abort_request(r)}
    scheduler._request_dispatcher = lambda r: handlers.get(type(r), lambda item: _arrive(scheduler, make, *item))(r)
    return scheduler


def _finalize(req: Any) -> bool:
    """`PrefillBootstrapQueue.finalize_bootstrap` without binding a metadata buffer: the bootstrap is done."""
    req.pending_bootstrap = False
    return True


class Batch:
    """The fields of `ScheduleBatch` that `get_next_disagg_prefill_batch_to_run` and `process_prefill_chunk`
    read, for a prefill (extend) batch."""

    def __init__(self, reqs: list[Any], chunked_req: Any) -> None:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        self.reqs = reqs
        self.chunked_req = chunked_req
        self.forward_mode = ForwardMode.EXTEND
        self.prefill_chunk_processed = False

    def batch_size(self) -> int:
        return len(self.reqs)

    def filter_batch(self, reqs_to_exclude: list[Any]) -> None:
        self.reqs = [req for req in self.reqs if req not in reqs_to_exclude]


def _admit(scheduler: Any, running_batch: Any) -> Any:
    """`get_new_batch_prefill` as this run's fixed budget decides it, the same on every rank: the chunked
    request's next chunk, then every waiting request but a `HELD` one; a `CHUNKED` one becomes the chunked
    request."""
    from sglang.srt.managers.schedule_batch import NextBatchPlan

    admitted = [req for req in scheduler.waiting_queue if not req.rid.startswith(HELD)]
    scheduler.waiting_queue = [req for req in scheduler.waiting_queue if req.rid.startswith(HELD)]
    reqs = [scheduler.chunked_req] if scheduler.chunked_req is not None else []
    for req in admitted:
        reqs.append(req)
        if req.rid.startswith(CHUNKED):
            scheduler.chunked_req = req
    batch = Batch(reqs, scheduler.chunked_req) if reqs else None
    return NextBatchPlan(batch_to_run=batch, running_batch=running_batch)


def _arrive(scheduler: Any, make: Callable[[str, stage.SlowReceiver], Any], kind: str, rid: str, polls: int) -> None:
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
    scheduler.disagg_prefill_bootstrap_queue.queue.append(make(rid, sender))


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
    real_admission = bool(sc.kv_free)
    scheduler = build(rank, group, singleton_groups(rank, sc.world), receiver,
                      sc.metadata_slots.get(rank, scenario_mod.METADATA_SLOTS),
                      sc.kv_free.get(rank, scenario_mod.KV_FREE) if real_admission else None)
    signals = sc.local_aborts.get(rank, {})
    events: dict[str, dict[str, int]] = {"dropped": {}, "prefilled": {}, "transferred": {}}
    batches: dict[int, list[str]] = {}  # iteration -> the rids of the batch this rank ran
    running_batch = prefill_admission.running_batch() if real_admission else SimpleNamespace(batch_is_full=False)
    last_batch = None
    iteration_ns: list[int] = []  # each iteration's wall time on this rank (tests.repro.overhead reads it)
    rank_writer.set_loop(LOOP)
    for iteration in range(sc.iterations):
        started_ns = time.perf_counter_ns()
        rank_hooks.before_intake(sc, rank, iteration, rank_writer)  # a straggle, or this rank's death
        held = _held(scheduler)
        scheduler.ingest_requests()  # SGLang's; its seam steps the iteration
        if iteration in signals:  # a rank-local abort decision (a per-rank clock, a local error handler)
            scheduler.abort_request(AbortReq(rid=signals[iteration]))
        # SGLang: guard, then the bootstrap poll.
        scheduler.waiting_queue.extend(scheduler.disagg_prefill_bootstrap_queue.pop_bootstrapped())
        # SGLang: the chunked abort, the waiting queue's bootstrap poll, the chunked request's, then admission.
        plan = scheduler.get_next_disagg_prefill_batch_to_run(running_batch=running_batch, last_batch=last_batch)
        running_batch, batch = plan.running_batch, plan.batch_to_run
        rank_writer.begin(phases.Phase.LOCAL)
        if batch:
            batches[iteration] = [req.rid for req in batch.reqs]
            rank_writer.begin(phases.Phase.FORWARD)
            time.sleep(sc.forward_s)
            done = [req for req in batch.reqs if req is not scheduler.chunked_req]
            for req in done:  # the last chunk is sent: the transfer is in flight
                req.disagg_kv_sender.start()
                events["prefilled"][req.rid] = iteration
            scheduler.disagg_prefill_inflight_queue.extend(done)
        else:
            rank_writer.begin(phases.Phase.IDLE)
            time.sleep(sc.idle_s)
        for req in scheduler.process_disagg_prefill_inflight_queue():  # SGLang: guard, then the transfer poll
            events["dropped" if _aborted(req) else "transferred"].setdefault(req.rid, iteration)
        rank_writer.begin(phases.Phase.LOCAL)
        last_batch = batch
        now_held = _held(scheduler)
        arrived = {rid for rid, _ in [*sc.arrivals.get(iteration, []), *sc.handshakes.get(iteration, [])]}
        for rid in (held | arrived) - now_held - set(events["transferred"]):
            events["dropped"].setdefault(rid, iteration)
        iteration_ns.append(time.perf_counter_ns() - started_ns)
    return {"rank": rank, "iterations": sc.iterations, "iteration_ns": iteration_ns, "batches": batches, **events}


def _held(scheduler: Any) -> set[str]:
    """The requests this rank still holds: queued for bootstrap, waiting, chunked, or in flight."""
    chunked = [scheduler.chunked_req] if scheduler.chunked_req is not None else []
    queues = [*scheduler.disagg_prefill_bootstrap_queue.queue, *scheduler.waiting_queue, *chunked,
              *scheduler.disagg_prefill_inflight_queue]
    return {req.rid for req in queues}


def _aborted(req: Any) -> bool:
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return isinstance(req.finished_reason, FINISH_ABORT)
