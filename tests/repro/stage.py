"""The SGLang objects one reproduction rank drives, built without their GPU-bound constructors.

What is SGLang's own code here (0.5.23, unmodified unless a pdfleet patch is applied):
`Scheduler.ingest_requests`, `Scheduler._poll_timeout_aborts`, `Scheduler.process_input_requests`,
`Scheduler.abort_request`, `SchedulerDisaggregationDecodeMixin.process_decode_queue`,
`DecodeTransferQueue.pop_transferred` (with its `if not self.queue: return []` guard),
`DecodeTransferQueue._poll_with_metadata_gate`, `poll_and_all_reduce`, `all_reduce_flags`, `broadcast_pyobj`,
`prepare_abort`, `ReqToMetadataIdxAllocator`, `DecodeRequest`, `AbortReq`, and the prealloc queue's handshake
poll `DecodePreallocQueue._update_handshake_waiters` (with its `if not self.queue: return` guard).

What is a stand-in, and why: the objects are made with `object.__new__` and given only the attributes these
methods read, because their constructors allocate KV pools, ZMQ sockets and CUDA state. The prealloc queue is a
`DecodePreallocQueue` whose memory-bound steps are stand-ins: `pop_preallocated` runs SGLang's handshake poll
and then admits every request whose handshake completed (no KV pools to budget; where a rank's memory would
decide differently, the scenario injects it), and `resume_retracted_reqs` resumes nothing (the scenario says
when a rank holds a retracted request). Arrivals go either straight to the transfer queue or, as handshakes,
to the prealloc queue; `_release_request` frees no KV (there is none on a CPU) and `_commit_transfer_to_req` reads no
metadata buffers (no prefill wrote any). The request and the KV receiver are small
fakes with the fields SGLang reads. The receiver's `abort()` carries the injected fault: it releases the
transfer on the spot, on the rank that aborted, instead of letting SGLang's MIN poll retire it on every rank.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams

_rooms = itertools.count(1000)
HANDSHAKE = "handshake"  # first field of an arrival bound for the prealloc queue: (HANDSHAKE, rid, polls)


def publish_context(world: int, role: str = "decode") -> None:
    """SGLang's process-wide config, as a TP-`world` server of `role` (decode or prefill) with the fake
    transfer backend would have it. Call once in the launcher, before the ranks fork."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = ["--model-path", "dummy", "--device", "cpu", "--tp-size", str(world), "--disaggregation-mode", role,
            "--disaggregation-transfer-backend", "fake"]
    server_args = ServerArgs.from_cli_args(parser.parse_args(argv))
    server_args.resolve_once()
    runtime_context.publish(server_args, role="test")


def set_rank(rank: int, world: int) -> None:
    """This process's place in the (single-stage, no DP, no CP) TP group."""
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(
        tp_rank=rank, attn_tp_rank=rank, pp_rank=0, attn_cp_rank=0, tp_size=world, attn_tp_size=world
    )


class SlowReceiver:
    """A KV receiver whose transfer lands after `polls_to_finish` polls (KVPoll values, as SGLang's are). With
    `handshake_polls`, it first answers Bootstrapping for that many polls, then WaitingForInput until it is
    started (preallocated)."""

    def __init__(self, polls_to_finish: int, on_abort: Callable[[SlowReceiver], None],
                 handshake_polls: int | None = None) -> None:
        from sglang.srt.disaggregation.base import KVPoll

        self._kvpoll = KVPoll
        self._left = polls_to_finish
        self._handshake_left = handshake_polls
        self._on_abort = on_abort
        self.aborted = False
        self.abort_notified = False
        self.require_staging = False

    def poll(self) -> int:
        if self.aborted:
            return self._kvpoll.Failed
        if self._handshake_left is not None:
            self._handshake_left -= 1
            return self._kvpoll.Bootstrapping if self._handshake_left > 0 else self._kvpoll.WaitingForInput
        self._left -= 1
        return self._kvpoll.Success if self._left <= 0 else self._kvpoll.Transferring

    def abort(self) -> None:
        if not self.aborted:
            self.aborted = True
            self._on_abort(self)

    def start(self) -> None:
        """Preallocated: the transfer begins."""
        self._handshake_left = None

    def failure_exception(self) -> None:
        raise RuntimeError("transfer aborted")

    def clear(self) -> None:
        pass


def new_request(rid: str) -> Any:
    """The fields of `Req` that the transfer queue and `prepare_abort` read; the fake backend's host, so
    SGLang's metadata gate passes it (as it does every request of `--disaggregation-transfer-backend fake`)."""
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

    return SimpleNamespace(
        rid=rid, bootstrap_host=FAKE_BOOTSTRAP_HOST, bootstrap_room=next(_rooms), finished_reason=None,
        to_finish=None, return_logprob=False, cache_request_handle=None,
        time_stats=SimpleNamespace(set_wait_queue_entry_time=lambda: None, set_bootstrap_done_time=lambda: None),
    )


def held_release(rid: str) -> tuple[Any, ...]:
    """An entry of `DecodeTransferQueue._deferred_releases` (request, start, deadline, index, acks) whose transfer
    never drains and whose deadline never comes: `resolve_deferred_releases` reduces its readiness every call."""
    manager = SimpleNamespace(is_abort_release_safe=lambda room, acks: False)
    decode_req = SimpleNamespace(req=new_request(rid), host_staged=False, kv_receiver=SimpleNamespace(kv_mgr=manager))
    return (decode_req, time.monotonic(), float("inf"), 0, 1)


def _noop(*_: Any, **__: Any) -> None:
    return None


def _commit(decode_req: Any) -> None:
    """What `DecodeTransferQueue._commit_transfer_to_req` leaves behind for a fake transfer, without reading
    the metadata buffers a prefill would have written (there is no prefill here)."""
    decode_req.kv_receiver = None
    decode_req.req.time_stats.set_wait_queue_entry_time()


def _unreachable(*_: Any, **__: Any) -> Any:
    raise AssertionError("a cache flush was decided in a loop that sends no /flush_cache")


def intake_attributes(receiver: Any) -> dict[str, Any]:
    """What `Scheduler.ingest_requests`, `process_input_requests` and `abort_request` read on a scheduler of
    either role, with `receiver` as its request receiver. The flush wrapper is SGLang's own, so that every
    iteration runs its `check_pending` (patched by flush-consensus) as `process_input_requests` does; with no
    flush sent it returns before deciding anything."""
    from sglang.srt.managers.scheduler_components.flush_wrapper import SchedulerFlushWrapper

    return dict(
        request_receiver=receiver, _deferred_input_requests=[],
        metrics_reporter=SimpleNamespace(enable_metrics=False, record_scheduler_active=_noop),
        scheduler_stage_metrics=None, session_controller=SimpleNamespace(maybe_reap=_noop), rust_server=None,
        flush_wrapper=SchedulerFlushWrapper(flush_cache=_unreachable, is_fully_idle=_unreachable,
                                            send_output=_unreachable),
        external_corpus_manager=None,
        return_health_check_ipcs=[], chunked_req=None, mm_receiver=None, waiting_queue=[], dllm_config=None,
        grammar_manager=SimpleNamespace(abort_requests=_noop), collect_inflight_reqs=list,
        output_streamer=SimpleNamespace(stream_output=_noop),
    )


def build(rank: int, group: Any, receiver: Any) -> tuple[Any, Any]:
    """(scheduler, transfer queue) for one rank. `receiver` is what `Scheduler.ingest_requests` pulls from:
    an object with `recv_requests(local_reqs=...)`."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue, DecodeTransferQueue
    from sglang.srt.disaggregation.utils import DisaggregationMode, ReqToMetadataIdxAllocator
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.scheduler import Scheduler

    scheduler = object.__new__(Scheduler)
    queue = object.__new__(DecodeTransferQueue)
    prealloc = object.__new__(DecodePreallocQueue)
    vars(scheduler).update(
        intake_attributes(receiver), disaggregation_mode=DisaggregationMode.DECODE,
        disagg_decode_prealloc_queue=prealloc, disagg_decode_transfer_queue=queue,
        enable_decode_hicache=False, enable_hisparse=False,
    )
    # Dispatch as Scheduler.init_request_dispatcher does for AbortReq; arrivals are plain tuples here.
    handlers: dict[type, Callable[[Any], Any]] = {AbortReq: lambda r: scheduler.abort_request(r)}
    scheduler._request_dispatcher = lambda r: handlers.get(type(r), scheduler.add_transfer)(r)
    vars(queue).update(
        queue=[], gloo_group=group, req_to_metadata_buffer_idx_allocator=ReqToMetadataIdxAllocator(64),
        tp_rank=rank, metadata_buffers=SimpleNamespace(clear_slot=_noop), scheduler=scheduler,
        enable_host_receive=False, tree_cache=SimpleNamespace(unlock=_noop), spec_algorithm=None,
        _skipped_checksum_signatures=set(), enable_staging=False, staging_handler=None,
        enable_deferred_kv_release=False, deferred_kv_release_timeout=0.0, _deferred_releases=[],
        _release_request=_noop, _commit_transfer_to_req=_commit,
    )
    vars(prealloc).update(
        queue=[], retracted_queue=[], pp_size=1, gloo_group=group, tp_rank=rank, scheduler=scheduler,
        resume_retracted_reqs=list, note_destinations_queued=_noop,
        pop_preallocated=lambda: _pop_preallocated(prealloc, queue),
    )
    scheduler.add_transfer = lambda item: (
        _add_handshake(prealloc, *item) if item[0] == HANDSHAKE else _add_transfer(queue, *item)
    )
    return scheduler, queue


def _pop_preallocated(prealloc: Any, transfer_queue: Any) -> tuple[list[Any], list[Any]]:
    """`DecodePreallocQueue.pop_preallocated` without KV pools: SGLang's handshake poll, the removal of
    requests it failed (SGLang's first pass), then every request waiting for input is preallocated."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    prealloc._update_handshake_waiters()  # SGLang's: `if not self.queue: return`, then poll_and_all_reduce
    failed = [d for d in prealloc.queue if isinstance(d.req.finished_reason, FINISH_ABORT)]
    ready = [d for d in prealloc.queue if d.waiting_for_input and d not in failed]
    prealloc.queue = [d for d in prealloc.queue if d not in failed and d not in ready]
    for decode_req in ready:
        decode_req.metadata_buffer_index = transfer_queue.req_to_metadata_buffer_idx_allocator.alloc()
        decode_req.kv_receiver.start()
    return ready, failed


def _add_transfer(queue: Any, rid: str, polls_to_finish: int) -> None:
    """A transfer arrives (on every rank: it came in the broadcast). Its receiver's abort releases it at once
    on the rank that aborted: the injected fault."""
    from sglang.srt.disaggregation.decode import DecodeRequest

    def release_now(receiver: SlowReceiver) -> None:
        for decode_req in queue.queue:
            if decode_req.kv_receiver is receiver:
                queue.req_to_metadata_buffer_idx_allocator.free(decode_req.metadata_buffer_index)
                decode_req.metadata_buffer_index = -1
        queue.queue = [d for d in queue.queue if d.kv_receiver is not receiver]

    index = queue.req_to_metadata_buffer_idx_allocator.alloc()
    receiver = SlowReceiver(polls_to_finish, release_now)
    queue.add(DecodeRequest(req=new_request(rid), kv_receiver=receiver, metadata_buffer_index=index))


def _add_handshake(prealloc: Any, _: str, rid: str, handshake_polls: int) -> None:
    """A request arrives in the prealloc queue (on every rank: it came in the broadcast); its KV lands one
    poll after it is preallocated. A local abort releases it from this rank's prealloc queue at once."""
    from sglang.srt.disaggregation.decode import DecodeRequest

    def release_now(receiver: SlowReceiver) -> None:
        prealloc.queue = [d for d in prealloc.queue if d.kv_receiver is not receiver]

    receiver = SlowReceiver(1, release_now, handshake_polls=handshake_polls)
    prealloc.queue.append(DecodeRequest(req=new_request(rid), kv_receiver=receiver))


class BroadcastReceiver:
    """`SchedulerRequestReceiver.recv_requests` for this run: rank 0 pulls the arrivals of the iteration and
    the aborts it decided (`local_reqs`), and SGLang's `broadcast_pyobj` sends them to every rank, as
    `_broadcast_reqs_across_ranks` does without DP attention. The ledger marks the broadcast as a collective."""

    def __init__(self, rank: int, group: Any, rank_writer: seams.Writer, inbox: Callable[[], list[Any]]) -> None:
        self.rank = rank
        self.group = group
        self.writer = rank_writer
        self.inbox = inbox

    def recv_requests(self, local_reqs: list[Any] | None = None) -> list[Any]:
        from sglang.srt.utils import broadcast_pyobj

        data = [*self.inbox(), *(local_reqs or [])] if self.rank == 0 else None
        self.writer.collective(phases.Phase.RECV_BROADCAST)
        received = broadcast_pyobj(data, self.rank, self.group, src=0)
        self.writer.begin(phases.Phase.LOCAL)
        return received


class PhaseLog:
    """The rank's ledger writer as the seams, the patches and the loop see it: every call is passed on, and the
    collective phases the rank entered are noted, so a run can show which collectives it went through (a
    patched run: pdfleet's exchanges, not the SGLang polls they replace), not only where it stopped."""

    def __init__(self, inner: seams.Writer) -> None:
        self.inner = inner
        self.entered: set[phases.Phase] = set()

    def begin(self, phase: phases.Phase) -> None:
        self.inner.begin(phase)

    def collective(self, phase: phases.Phase) -> None:
        self.entered.add(phase)
        self.inner.collective(phase)

    def step(self) -> None:
        self.inner.step()

    def set_loop(self, loop: phases.LoopName) -> None:
        self.inner.set_loop(loop)

    def close(self) -> None:
        self.inner.close()

    def labels(self) -> list[str]:
        return sorted(phase.label for phase in self.entered)
