"""The wrappers that run inside a scheduler rank's event loop: the hot path of the instrumentation.

Each wrapper does what the original does, plus one or two `RankWriter` calls around it. Cost rules (the
ledger's budget is well under a microsecond per step, see `health.writer`):
- no `*args, **kwargs`: packing them allocates a tuple and a dict on every call, so every wrapper repeats its
  target's exact parameters (names, order and defaults; `tests/unit/test_instrument.py` compares them with
  the installed SGLang) and passes them on positionally;
- no locks, no `try`/`finally`: an exception out of a collective ends the rank anyway, and the agent then
  sees a dead process, which says more than a tidied-up phase would;
- the writer is one module global, read once per call. Before the rank attaches (and in processes that never
  do: the launcher, the tokenizer, the detokenizer), it is `UNATTACHED`, whose methods do nothing, so no
  wrapper needs a branch.

A collective is entered with `collective(phase)` and left with `begin(LOCAL)`, so a rank that has left it and
is busy with its own work is never mistaken for one still waiting on its peers.

SGLang calls one KV-poll function from several queues, and a desync verdict must say which of them a rank waits
in (docs/desync-audit.md). The poll wrappers therefore take `sites`: the code object of each audited caller ->
its phase (`rank_seams.sites_by_code`). The caller is read from the interpreter's frame stack: one
`sys._getframe(1)` (CPython 3.11 materializes the caller's frame object for it, freed with that frame) and
one dict lookup, measured at 0.4-0.5 us per poll on a loaded 2-core machine, next to a gloo all-reduce of tens
of microseconds; it needs no extra seam on the callers, several of which catalogue patches replace. Any other
caller records KV_POLL_ALL_REDUCE.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from types import CodeType
from typing import Any, Protocol

from pdfleet.runtime.health import phases

# Module constants: one global load each, instead of an attribute lookup on the enum per call.
_RECV = phases.Phase.RECV_BROADCAST
_KV_POLL = phases.Phase.KV_POLL_ALL_REDUCE
_MLP_SYNC = phases.Phase.MLP_SYNC_ALL_GATHER
_OTHER = phases.Phase.OTHER_COLLECTIVE
_LOCAL = phases.Phase.LOCAL
_FORWARD = phases.Phase.FORWARD
_IDLE = phases.Phase.IDLE
_OFFLOAD_DRAIN = phases.Phase.OFFLOAD_RETRACTION_DRAIN
_OFFLOAD_PROGRESS = phases.Phase.OFFLOAD_PROGRESS

Fn = Callable[..., Any]
Sites = Mapping[CodeType, phases.Phase]  # an audited caller's code -> the phase of the poll it enters
NO_SITES: Sites = {}


class Writer(Protocol):
    """What the seams call: `health.writer.RankWriter`, or `UNATTACHED`."""

    def begin(self, phase: phases.Phase) -> None: ...
    def collective(self, phase: phases.Phase) -> None: ...
    def step(self) -> None: ...
    def set_loop(self, loop: phases.LoopName) -> None: ...
    def close(self) -> None: ...


class _Unattached:
    """The writer of a process that has no ledger slot (yet): every call does nothing."""

    __slots__ = ()

    def begin(self, phase: phases.Phase) -> None:
        pass

    def collective(self, phase: phases.Phase) -> None:
        pass

    def step(self) -> None:
        pass

    def set_loop(self, loop: phases.LoopName) -> None:
        pass

    def close(self) -> None:
        pass


UNATTACHED: Writer = _Unattached()
_writer: Writer = UNATTACHED


def use(writer: Writer) -> None:
    """Make `writer` the one every seam of this process writes to (the rank's, once it attached)."""
    global _writer
    _writer = writer


def current() -> Writer:
    return _writer


def in_collective(phase: phases.Phase, collective: Callable[[], Any]) -> Any:
    """Runs one collective a catalogue patch adds (its lockstep exchanges and agreements), marked in the rank's
    ledger as `phase` while it waits; a no-op marking before the rank attaches."""
    w = _writer
    w.collective(phase)
    result = collective()
    w.begin(_LOCAL)
    return result


# --- one step per event-loop iteration ------------------------------------------------------------------
# Every event loop of SGLang 0.5.23 (normal, overlap, pp, their disagg prefill/decode forms, overlap_mlx,
# pdmux) calls `Scheduler.ingest_requests` exactly once per iteration (per micro-batch for pp), even with
# TP 1 where no broadcast happens: the one place to count iterations.

def ingest_requests(original: Fn) -> Fn:
    def ingest_requests(self: Any, stop_at_pause: bool = False) -> Any:
        _writer.step()
        return original(self, stop_at_pause)
    return ingest_requests


# --- collectives ----------------------------------------------------------------------------------------

def broadcast_pyobj(original: Fn) -> Fn:
    """Request intake over the TP CPU group (`SchedulerRequestReceiver._broadcast_reqs_across_ranks`)."""
    def broadcast_pyobj(data: Any, rank: int, dist_group: Any = None, src: int = 0,
                        force_cpu_device: bool = True) -> Any:
        w = _writer
        w.collective(_RECV)
        out = original(data, rank, dist_group, src, force_cpu_device)
        w.begin(_LOCAL)
        return out
    return broadcast_pyobj


def attn_cp_tp_broadcast_pyobj(original: Fn) -> Fn:
    """Request intake with DP attention: one logical broadcast (one or two gloo broadcasts inside, depending
    on the rank's attention-CP position), counted once so that every rank of a shard counts alike."""
    def attn_cp_tp_broadcast_pyobj(data: Any) -> Any:
        w = _writer
        w.collective(_RECV)
        out = original(data)
        w.begin(_LOCAL)
        return out
    return attn_cp_tp_broadcast_pyobj


def poll_and_all_reduce(original: Fn, sites: Sites = NO_SITES) -> Fn:
    site, frame = sites.get, sys._getframe

    def poll_and_all_reduce(pollers: Any, gloo_group: Any, decode_reqs: Any = None,
                            metadata_buffers: Any = None) -> Any:
        w = _writer
        w.collective(site(frame(1).f_code, _KV_POLL))
        out = original(pollers, gloo_group, decode_reqs, metadata_buffers)
        w.begin(_LOCAL)
        return out
    return poll_and_all_reduce


def poll_and_all_reduce_with_staging(original: Fn, sites: Sites = NO_SITES) -> Fn:
    site, frame = sites.get, sys._getframe

    def poll_and_all_reduce_with_staging(decode_reqs: Any, staging_handler: Any, gloo_group: Any,
                                         metadata_buffers: Any = None, pollers: Any = None) -> Any:
        w = _writer
        w.collective(site(frame(1).f_code, _KV_POLL))
        out = original(decode_reqs, staging_handler, gloo_group, metadata_buffers, pollers)
        w.begin(_LOCAL)
        return out
    return poll_and_all_reduce_with_staging


def poll_and_all_reduce_attn_cp_tp_group(original: Fn, sites: Sites = NO_SITES) -> Fn:
    site, frame = sites.get, sys._getframe

    def poll_and_all_reduce_attn_cp_tp_group(pollers: Any, attn_cp_cpu_group: Any, attn_tp_cpu_group: Any) -> Any:
        w = _writer
        w.collective(site(frame(1).f_code, _KV_POLL))
        out = original(pollers, attn_cp_cpu_group, attn_tp_cpu_group)
        w.begin(_LOCAL)
        return out
    return poll_and_all_reduce_attn_cp_tp_group


def poll_and_all_reduce_prefill_pp(original: Fn) -> Fn:
    def poll_and_all_reduce_prefill_pp(pollers: Any, attn_cp_cpu_group: Any, attn_tp_cpu_group: Any, pp_group: Any,
                                       pp_rank: int, pp_size: int, pp_poll_sync_work_list: Any) -> Any:
        w = _writer
        w.collective(_KV_POLL)
        out = original(pollers, attn_cp_cpu_group, attn_tp_cpu_group, pp_group, pp_rank, pp_size,
                       pp_poll_sync_work_list)
        w.begin(_LOCAL)
        return out
    return poll_and_all_reduce_prefill_pp


def all_reduce_flags(original: Fn, sites: Sites = NO_SITES) -> Fn:
    """SGLang's flag reductions called directly by a queue (the ones inside the polls count as the poll). On an
    empty list SGLang enters no collective, and `pop_transferred` calls it so on nearly every poll: only a call
    that reduces is marked."""
    site, frame = sites.get, sys._getframe

    def all_reduce_flags(flags: Any, group: Any, op: Any) -> Any:
        if not flags:
            return original(flags, group, op)
        w = _writer
        w.collective(site(frame(1).f_code, _OTHER))
        out = original(flags, group, op)
        w.begin(_LOCAL)
        return out
    return all_reduce_flags


def all_gather_object(original: Fn, sites: Sites = NO_SITES) -> Fn:
    """`torch.distributed.all_gather_object`, which SGLang calls as an attribute of `torch.distributed` at call
    time: marked only when an audited caller entered it (the grammar queue's ready/failed gather, the VMM
    materialization errors). Every other caller (model load, LoRA, weight updates) passes through unmarked,
    after the frame lookup only: a gather of pickled objects costs far more than that."""
    site, frame = sites.get, sys._getframe

    def all_gather_object(object_list: Any, obj: Any, group: Any = None, weights_only: bool = False) -> Any:
        phase = site(frame(1).f_code)
        if phase is None:
            return original(object_list, obj, group, weights_only)
        w = _writer
        w.collective(phase)
        out = original(object_list, obj, group, weights_only)
        w.begin(_LOCAL)
        return out
    return all_gather_object


def mlp_sync_all_gather(original: Fn) -> Fn:
    """`MLPSyncBatchInfo.all_gather`: the DP-attention batch sync, entered only when the gather happens."""
    def all_gather(self: Any, device: Any, group: Any, use_all_reduce: bool = False) -> Any:
        w = _writer
        w.collective(_MLP_SYNC)
        out = original(self, device, group, use_all_reduce)
        w.begin(_LOCAL)
        return out
    return all_gather


_draining = False  # inside drain_before_retraction: its seam marks the whole drain, nested progress included


def offload_drain(original: Fn) -> Fn:
    """`DecodeKVCacheOffloadManager.drain_before_retraction`: entered only by a rank that retracts, then two
    all-reduces (its progress check's MIN, its own MAX over pending copies); marked as one collective for the
    whole call, so a rank that drained alone reads as waiting in the drain."""
    def drain_before_retraction(self: Any) -> Any:
        global _draining
        w = _writer
        w.collective(_OFFLOAD_DRAIN)
        _draining = True
        out = original(self)
        _draining = False
        w.begin(_LOCAL)
        return out
    return drain_before_retraction


def offload_progress(original: Fn) -> Fn:
    """`DecodeKVCacheOffloadManager.check_offload_progress`: a MIN all-reduce of two queue sizes, every
    decode-queue pass with offload on; inside the drain it is part of the drain."""
    def check_offload_progress(self: Any) -> Any:
        if _draining:
            return original(self)
        w = _writer
        w.collective(_OFFLOAD_PROGRESS)
        out = original(self)
        w.begin(_LOCAL)
        return out
    return check_offload_progress


# --- forward and idle -----------------------------------------------------------------------------------

def run_batch(original: Fn) -> Fn:
    """The forward. With the overlap schedule it returns once the batch is launched; waiting for its
    results happens later, in result processing (LOCAL)."""
    def run_batch(self: Any, batch: Any, pp_proxy_tensors: Any = None) -> Any:
        w = _writer
        w.begin(_FORWARD)
        out = original(self, batch, pp_proxy_tensors)
        w.begin(_LOCAL)
        return out
    return run_batch


def on_idle(original: Fn) -> Fn:
    def on_idle(self: Any) -> Any:
        w = _writer
        w.begin(_IDLE)
        out = original(self)
        w.begin(_LOCAL)
        return out
    return on_idle
