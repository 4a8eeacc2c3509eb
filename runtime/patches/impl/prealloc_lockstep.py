"""kv-poll-lockstep, part two: the decode loop's other rank-local gates in front of its KV polls.

Why. Two more branches of SGLang 0.5.23's decode loop read rank-local state and then skip a collective that
peers enter (docs/desync-audit.md):
- `SchedulerDisaggregationDecodeMixin.process_decode_queue` returns early while
  `len(prealloc_queue.retracted_queue) > 0`. Retraction and resumption read the rank's own allocators, so one
  rank can hold a retracted request while its peers hold none: it skips the prealloc and transfer polls
  (and the lockstep exchange) that its peers enter.
- `DecodePreallocQueue._update_handshake_waiters` starts with `if not self.queue: return` and then
  MIN-all-reduces one handshake state per queued request. `pop_preallocated` moves requests on to the transfer
  queue as the rank's own memory allows, so prealloc queues differ in length between ranks, and the rank with
  an empty one skips the all-reduce (a different length mis-pairs it).

What the patch does instead:
- The retraction gate is agreed: every rank MAX-all-reduces one flag, "I hold a retracted request", and all
  ranks skip the polls together while any rank holds one (SGLang's intent, admit nothing new under memory
  pressure, kept for the group). The rest of `process_decode_queue` is 0.5.23's body, unchanged.
- The handshake poll is the lockstep exchange of `kv_poll_lockstep`: every rank, every call, whatever its
  prealloc queue holds, all-gathers fixed-shape rows of (request key, handshake state). A request held by
  every rank gets the MIN of their states; one missing on some rank gets Failed (it cannot complete there),
  so SGLang's own failed-handshake path retires it on the ranks that still hold it. SGLang's handling of
  each state (0.5.23's loop) then runs on the agreed states. The PP
  path (`pp_size > 1`) follows the pipeline's consensus and is passed through unchanged.
In the rank-health ledger the agreement is RETRACTION_AGREEMENT and the handshake exchange
PREALLOC_HANDSHAKE_EXCHANGE, so a desync verdict names which of pdfleet's collectives a rank waits in.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches.impl import kv_poll_lockstep as lockstep

logger = logging.getLogger(__name__)

# Targets and fingerprints are declared with the patch's others, in `kv_poll_lockstep`.
PROCESS_DECODE_QUEUE = lockstep.PROCESS_DECODE_QUEUE
UPDATE_HANDSHAKE_WAITERS = lockstep.UPDATE_HANDSHAKE_WAITERS


def handshake_states(per_rank: Sequence[Sequence[lockstep.Entry]], failed: int) -> dict[int, int]:
    """Pure: key -> its agreed handshake state. Held by every rank: the smallest state any rank reported
    (KVPoll.Failed is 0: one failure is everyone's failure). Missing on some rank (released or moved on there
    alone): `failed`, because a request not held by every rank can never complete (the transfer lockstep
    drops it too), and SGLang's own failed-handshake path then retires it on every rank that still holds it."""
    held = [dict(entries) for entries in per_rank]
    keys = set().union(*held) if held else set()
    return {key: min(h[key] for h in held) if all(key in h for h in held) else failed for key in keys}


def any_rank(flag: bool, group: Any) -> bool:
    """True on every rank when `flag` is true on some rank of `group`: one MAX all-reduce, entered by every
    rank whatever its flag."""
    import torch
    import torch.distributed as dist

    if dist.get_world_size(group) == 1:
        return flag
    tensor = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return bool(tensor.item())


def _handle_handshake_states(queue: Any, polls: Sequence[int | None], rids_to_check: list[str] | None,
                             sg: Any) -> None:
    """0.5.23's handling of the reduced handshake states (the loop after the all-reduce), unchanged."""
    for decode_req, poll in zip(queue.queue, polls, strict=True):
        if poll is None:
            continue
        if rids_to_check is not None and decode_req.req.rid not in rids_to_check:
            continue
        if poll == sg.KVPoll.Bootstrapping:
            pass
        elif poll == sg.KVPoll.WaitingForInput:
            decode_req.waiting_for_input = True
            decode_req.req.time_stats.set_bootstrap_done_time()
        elif poll == sg.KVPoll.Failed:
            message = (f"Decode handshake failed for request rank={queue.tp_rank} "
                       f"decode_req.req.rid={decode_req.req.rid!r} "
                       f"decode_req.req.bootstrap_room={decode_req.req.bootstrap_room!r}")
            propagated = False
            try:
                decode_req.kv_receiver.failure_exception()
            except Exception as e:  # SGLang's receivers raise their own failure types
                message += f" with exception {e}"
                propagated = getattr(e, "is_from_another_rank", False)
            (logger.debug if propagated else logger.error)(message)
            sg.prepare_abort(decode_req.req, message, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)
            if queue.scheduler.metrics_reporter.enable_metrics:
                queue.scheduler.metrics_collector.increment_bootstrap_failed_reqs()
        else:
            raise ValueError(f"Unexpected poll case: {poll}")


def _rest_of_decode_queue(self: Any, sg: Any) -> None:
    """0.5.23's `process_decode_queue` after its retraction gate, unchanged."""
    if not hasattr(self, "polling_count"):
        self.polling_count = 0
        self.polling_interval = sg.get_disagg().disaggregation_decode_polling_interval
    self.polling_count = (self.polling_count + 1) % self.polling_interval
    if self.polling_count % self.polling_interval != 0:
        return
    if sg.get_disagg().disaggregation_decode_host_receive_threshold == 1:
        req_conns, _ = self.disagg_decode_prealloc_queue.pop_preallocated()
        self.disagg_decode_transfer_queue.extend(req_conns)
    transferred_reqs = self.disagg_decode_transfer_queue.pop_transferred()
    if self.enable_hisparse:
        for req in transferred_reqs:
            self.hisparse_coordinator.admit_request_direct(req)
    self.waiting_queue.extend(transferred_reqs)
    if sg.get_disagg().disaggregation_decode_host_receive_threshold < 1:
        req_conns, _ = self.disagg_decode_prealloc_queue.pop_preallocated()
        self.disagg_decode_transfer_queue.extend(req_conns)


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The agreed retraction gate and the lockstep handshake poll; SGLang's names are bound here."""
    from sglang.srt.disaggregation import decode

    sg = decode  # KVPoll, prepare_abort, get_disagg: looked up where 0.5.23's own code looks them up
    poll = lockstep._bind_sglang().poll
    original_process = originals[PROCESS_DECODE_QUEUE]
    original_handshake = originals[UPDATE_HANDSHAKE_WAITERS]

    @functools.wraps(original_process)
    def process_decode_queue(self: Any) -> None:
        if self.enable_decode_hicache:
            self.tree_cache.check_hicache_events()
        if sg.get_disagg().disaggregation_decode_enable_offload_kvcache:
            self.decode_offload_manager.check_offload_progress()
        self.disagg_decode_transfer_queue.resolve_deferred_releases()
        prealloc = self.disagg_decode_prealloc_queue
        self.waiting_queue.extend(prealloc.resume_retracted_reqs())
        group = self.disagg_decode_transfer_queue.gloo_group
        retracted = len(prealloc.retracted_queue) > 0
        if seams.in_collective(phases.Phase.RETRACTION_AGREEMENT, lambda: any_rank(retracted, group)):
            return  # some rank still holds a retracted request: no rank admits or polls this iteration
        _rest_of_decode_queue(self, sg)

    @functools.wraps(original_handshake)
    def _update_handshake_waiters(self: Any, rids_to_check: list[str] | None = None,
                                  pp_good_rids: list[str] | None = None,
                                  pp_bad_rids: list[str] | None = None) -> None:
        if self.pp_size > 1:  # PP: follows the pipeline's consensus, unchanged
            return original_handshake(self, rids_to_check, pp_good_rids, pp_bad_rids)
        keys = [lockstep.request_key(decode_req.req.rid) for decode_req in self.queue]
        local = poll([decode_req.kv_receiver for decode_req in self.queue])
        entries = list(zip(keys, local, strict=True))
        per_rank = seams.in_collective(phases.Phase.PREALLOC_HANDSHAKE_EXCHANGE,
                                      lambda: lockstep.exchange(entries, self.gloo_group))
        agreed = handshake_states(per_rank, failed=int(sg.KVPoll.Failed))
        _handle_handshake_states(self, [agreed[key] for key in keys], rids_to_check, sg)
        return None

    return {PROCESS_DECODE_QUEUE: process_decode_queue, UPDATE_HANDSHAKE_WAITERS: _update_handshake_waiters}
