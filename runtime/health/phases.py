"""The fixed tables a ledger record refers to by number: the phase a rank is in, and its event loop.

Records store small integers, never strings, so the hot path writes one machine word. The numbers are a
wire format shared by writers and readers that may run different pdfleet versions (an engine image and
the operator are upgraded separately), so they are append-only: never renumber or reuse a value. A value
a reader does not know decodes to UNKNOWN instead of failing.
"""

from __future__ import annotations

import enum

# Phases at or above this value are collectives: the rank waits there for its peers.
_FIRST_COLLECTIVE = 16


class Phase(enum.IntEnum):
    """Where a rank is inside its scheduler loop iteration."""

    UNKNOWN = 0
    STARTING = 1  # writer attached; the event loop has not begun (model load, warmup)
    LOCAL = 2  # rank-local work between collectives: scheduling, result processing
    IDLE = 3  # no batch this iteration (`on_idle`)
    FORWARD = 4  # running a batch; its NCCL collectives are inside and shared by all ranks
    EXITED = 5  # the writer was closed cleanly
    RECV_BROADCAST = _FIRST_COLLECTIVE  # request intake: `broadcast_pyobj` over the TP CPU group
    KV_POLL_ALL_REDUCE = 17  # `poll_and_all_reduce` of KV-transfer poll states (gloo)
    MLP_SYNC_ALL_GATHER = 18  # DP-attention batch sync before the forward
    OTHER_COLLECTIVE = 19  # any other cross-rank collective the instrumentation wraps
    # SGLang's own KV polls, by the audited caller they were entered from (docs/desync-audit.md); a poll
    # entered from any other caller stays KV_POLL_ALL_REDUCE.
    PREALLOC_HANDSHAKE_POLL = 20  # DecodePreallocQueue._update_handshake_waiters
    DECODE_TRANSFER_POLL = 21  # DecodeTransferQueue._poll_with_metadata_gate / _poll_with_staging
    PREFILL_BOOTSTRAP_POLL = 22  # PrefillBootstrapQueue.pop_bootstrapped
    PREFILL_INFLIGHT_POLL = 23  # process_disagg_prefill_inflight_queue
    PREFILL_WAITING_BOOTSTRAP_POLL = 24  # resolve_waiting_queue_bootstrap
    PREFILL_CHUNK_BOOTSTRAP_POLL = 25  # check_bootstrap
    # pdfleet's own collectives, entered by every rank in place of a rank-local branch (kv-poll-lockstep).
    RETRACTION_AGREEMENT = 26  # MAX all-reduce of "I hold a retracted request" (process_decode_queue)
    PREALLOC_HANDSHAKE_EXCHANGE = 27  # lockstep exchange in place of the handshake poll
    DECODE_TRANSFER_EXCHANGE = 28  # lockstep exchange in front of pop_transferred
    PREFILL_BOOTSTRAP_EXCHANGE = 29  # lockstep exchange in place of pop_bootstrapped's poll
    PREFILL_INFLIGHT_EXCHANGE = 30  # lockstep exchange in place of the inflight queue's poll
    # SGLang's own flag reductions (`all_reduce_flags`) called directly by the decode queues, by caller.
    FAILED_TRANSFER_FLAGS = 31  # pop_transferred's `held` MAX over the failed transfers
    DEFERRED_RELEASE_FLAGS = 32  # resolve_deferred_releases' `ready` MIN
    KV_CHECKSUM_FLAGS = 33  # _verify_kv_checksums' `mismatched` MAX
    # kv-poll-lockstep's exchanges in front of the prefill loop's two other bootstrap polls.
    PREFILL_WAITING_BOOTSTRAP_EXCHANGE = 34  # in place of resolve_waiting_queue_bootstrap's poll
    PREFILL_CHUNK_BOOTSTRAP_EXCHANGE = 35  # in process_prefill_chunk, in place of check_bootstrap's poll
    # health-check-consensus: MIN all-reduce of "I am idle" over the ranks that share a health-check request.
    HEALTH_CHECK_AGREEMENT = 36  # in Scheduler.is_fully_idle(for_health_check=True), from process_input_requests
    # retraction-consensus: MIN all-reduce of "the next decode step fits in my KV pool" (and, with a host-pool
    # retraction backup, of "my host pool took this request's backup") over the batch's ranks.
    DECODE_MEMORY_AGREEMENT = 37  # ScheduleBatch.check_decode_mem / release_req, inside update_running_batch
    # SGLang's decode KV offload (--disaggregation-decode-enable-offload-kvcache): its two all-reduce sites.
    OFFLOAD_RETRACTION_DRAIN = 38  # DecodeKVCacheOffloadManager.drain_before_retraction (both its all-reduces)
    OFFLOAD_PROGRESS = 39  # DecodeKVCacheOffloadManager.check_offload_progress, each decode-queue pass
    # admission-consensus: MIN all-reduce of the free capacities a decode prealloc queue admits and resumes by.
    ADMISSION_AGREEMENT = 40  # decode pop_preallocated / resume_retracted_reqs; prefill admission, metadata buffers
    # SGLang's own `all_gather_object` calls from the scheduler loop, by the audited caller that entered them.
    GRAMMAR_READY_GATHER = 41  # GrammarManager.get_ready_grammar_requests' ready/failed indices (sync size > 1)
    VMM_ERROR_GATHER = 42  # Scheduler._gather_vmm_materialization_errors, from process_input_requests
    # flush-consensus: MIN all-reduce of the flush decisions (idle; the leader's deadline) over the flush's ranks.
    FLUSH_AGREEMENT = 43  # SchedulerFlushWrapper.handle / check_pending, from process_input_requests
    # grammar-consensus: MIN all-reduce of grammar outcomes (compiled; a token rejected) over the batch's ranks.
    GRAMMAR_AGREEMENT = 44  # GrammarManager.get_ready_grammar_requests, batch results, disagg prefill accepts

    @classmethod
    def _missing_(cls, value: object) -> Phase:
        return cls.UNKNOWN

    @property
    def is_collective(self) -> bool:
        """A rank in a collective cannot leave it until every peer enters the same one."""
        return self >= _FIRST_COLLECTIVE

    @property
    def label(self) -> str:
        return self.name.lower()


class LoopName(enum.IntEnum):
    """SGLang's scheduler event loops, by the method name `_dispatch_event_loop_once` calls."""

    UNKNOWN = 0
    EVENT_LOOP_NORMAL = 1
    EVENT_LOOP_OVERLAP = 2
    EVENT_LOOP_PP = 3
    EVENT_LOOP_NORMAL_DISAGG_PREFILL = 4
    EVENT_LOOP_OVERLAP_DISAGG_PREFILL = 5
    EVENT_LOOP_PP_DISAGG_PREFILL = 6
    EVENT_LOOP_NORMAL_DISAGG_DECODE = 7
    EVENT_LOOP_OVERLAP_DISAGG_DECODE = 8
    EVENT_LOOP_PP_DISAGG_DECODE = 9
    EVENT_LOOP_OVERLAP_MLX = 10
    EVENT_LOOP_PDMUX = 11

    @classmethod
    def _missing_(cls, value: object) -> LoopName:
        return cls.UNKNOWN

    @classmethod
    def from_method(cls, method_name: str) -> LoopName:
        """The id of a loop method name; UNKNOWN for a loop this table does not know yet (a new SGLang
        version), so instrumentation never fails on it and the operator sees that it is unknown."""
        return cls.__members__.get(method_name.upper(), cls.UNKNOWN)

    @property
    def method(self) -> str:
        return self.name.lower()


def phase_from_label(label: str) -> Phase:
    """The phase a JSON label names (UNKNOWN when it names none)."""
    return Phase.__members__.get(label.upper(), Phase.UNKNOWN)


def loop_from_label(label: str) -> LoopName:
    """The loop a JSON label names (UNKNOWN when it names none)."""
    return LoopName.from_method(label)
