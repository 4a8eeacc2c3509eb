"""kv-poll-lockstep: every TP rank joins the decode KV-transfer poll exchange on every call, with a fixed shape.

Why. In SGLang 0.5.23 `DecodeTransferQueue.pop_transferred` starts with `if not self.queue: return []` and only
then MIN-all-reduces one poll state per queued request (`poll_and_all_reduce` -> `all_reduce_flags`, itself a
no-op on an empty list). Both guards read rank-local state. When one rank's queue differs from its peers' (a
rank-local abort released a transfer on that rank only), the ranks with requests wait in the poll all-reduce
while the rank without them has already moved on to the next request broadcast: a permanent hang, and the MIN
all-reduce that was meant to keep ranks together is exactly the collective they desync on.

What this patch does instead, on every call and on every rank whatever its queue holds:
1. Each rank polls its own receivers (SGLang's own `_poll_with_failure_injection` and metadata gate).
2. The ranks all-gather fixed-size rows of (request key, poll state): `ROUND` entries per row, padded, so the
   payload shape never depends on a queue length. A first row is always exchanged; when some rank holds more
   than `ROUND` requests, every rank learns that from the first row and all exchange the same number of rows.
3. From the gathered rows every rank computes the same `Agreement` (a pure function of what all ranks sent):
   the requests that every rank holds, in the lead rank's order, with the MIN of their poll states.
4. A request missing on some rank can never complete there, so the ranks that still hold it abort it locally
   (the same clean-up as SGLang's failed-transfer path, minus its collective); the queue is put in the agreed
   order. Every rank now holds the same queue, so SGLang's own code after the poll (its guards, the failed-
   transfer `held` all-reduce, the deferred releases) sees the same lengths on every rank.
5. The original `pop_transferred` then runs; its poll step (`_poll_with_metadata_gate`) returns the agreed
   states instead of polling and reducing a second time.
The exchange is marked in the rank-health ledger as DECODE_TRANSFER_EXCHANGE (`instrument.seams`), so a rank
waiting in it is told apart from one in SGLang's own transfer poll (DECODE_TRANSFER_POLL).

Keys are a 63-bit hash of the request id (ids are strings; every rank received the same id in the same
broadcast). The same patch also agrees the decode loop's retraction gate and runs the prealloc queue's
handshake poll as a lockstep exchange (`prealloc_lockstep`), so no decode KV poll is skipped by one rank, and
does the same for the prefill loop's bootstrap, waiting-queue, chunked-request and inflight polls
(`prefill_lockstep`). A transfer dropped in step 4 keeps its pages until the prefill side lets go
(`dropped_holds`). Not covered here (see the
catalogue entry): the PP path (`rids_to_check`), which follows the previous stage's consensus and is passed
through unchanged. With SGLang's staging buffer the
original staging poll still runs after the exchange, on queues that now agree.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches.impl import dropped_holds

logger = logging.getLogger(__name__)

PATCH_ID = "kv-poll-lockstep"
POP_TRANSFERRED = "sglang.srt.disaggregation.decode.DecodeTransferQueue.pop_transferred"
POLL_WITH_METADATA_GATE = "sglang.srt.disaggregation.decode.DecodeTransferQueue._poll_with_metadata_gate"
PROCESS_DECODE_QUEUE = "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.process_decode_queue"
UPDATE_HANDSHAKE_WAITERS = "sglang.srt.disaggregation.decode.DecodePreallocQueue._update_handshake_waiters"
POP_BOOTSTRAPPED = "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.pop_bootstrapped"
PROCESS_INFLIGHT = (
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue"
)
RESOLVE_WAITING_BOOTSTRAP = (
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.resolve_waiting_queue_bootstrap"
)
PROCESS_PREFILL_CHUNK = "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_prefill_chunk"
RELEASE_MEMORY_OCCUPATION = "sglang.srt.disaggregation.decode.DecodeTransferQueue.release_memory_occupation"
TARGETS = (POP_TRANSFERRED, POLL_WITH_METADATA_GATE, PROCESS_DECODE_QUEUE, UPDATE_HANDSHAKE_WAITERS,
           POP_BOOTSTRAPPED, PROCESS_INFLIGHT, RESOLVE_WAITING_BOOTSTRAP, PROCESS_PREFILL_CHUNK,
           RELEASE_MEMORY_OCCUPATION)

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        POP_TRANSFERRED: "48b558ef62c0e97d",
        POLL_WITH_METADATA_GATE: "4976472dc53c84ea",
        PROCESS_DECODE_QUEUE: "18ed61a5b9ab4162",
        UPDATE_HANDSHAKE_WAITERS: "48508b8bf97ac7db",
        POP_BOOTSTRAPPED: "0ecb934dee8b9774",
        PROCESS_INFLIGHT: "b67e2acef55ff84f",
        RESOLVE_WAITING_BOOTSTRAP: "d46052adb7948a70",
        PROCESS_PREFILL_CHUNK: "fb613f761a11235d",
        RELEASE_MEMORY_OCCUPATION: "3bb2541446acb6ff",
    },
}

ROUND = 64  # (key, state) pairs per exchanged row
PAD_KEY = -1  # keys are non-negative, so -1 marks an unused pair
_HEADER = 2  # [requests this rank holds in total, pairs used in this row]
ROW_WIDTH = _HEADER + 2 * ROUND

# The attribute that carries the agreed poll states from pop_transferred to its own poll step.
_AGREED = "_pdfleet_agreed_polls"

Entry = tuple[int, int]  # (request key, poll state)


def request_key(rid: str) -> int:
    """A stable non-negative 63-bit key for a request id, equal on every rank and in every process."""
    digest = hashlib.blake2b(rid.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What every rank concludes from one exchange: the requests held by all ranks (in the lead rank's
    order) and, for each, the smallest poll state any rank reported (KVPoll.Failed is 0: one failure is
    everyone's failure; Success only when every rank succeeded)."""

    order: tuple[int, ...]
    states: Mapping[int, int]


def agree(per_rank: Sequence[Sequence[Entry]]) -> Agreement:
    """Pure: the agreement over what each rank sent. Rank 0 leads the order; a key some rank did not send is
    left out, so that every rank drops it."""
    if not per_rank:
        return Agreement(order=(), states={})
    held = [dict(entries) for entries in per_rank]
    common = set(held[0]).intersection(*held[1:])
    order = tuple(dict.fromkeys(key for key, _ in per_rank[0] if key in common))
    states = {key: min(h[key] for h in held) for key in order}
    return Agreement(order=order, states=states)


def rounds_needed(totals: Sequence[int]) -> int:
    """How many rows every rank exchanges: enough for the largest queue, and at least one."""
    return max(1, -(-max(totals, default=0) // ROUND))


def pack_row(entries: Sequence[Entry], index: int) -> list[int]:
    """Row `index` of a rank's exchange: its total, the pairs it carries, then keys and states, padded."""
    chunk = entries[index * ROUND : (index + 1) * ROUND]
    keys = [key for key, _ in chunk] + [PAD_KEY] * (ROUND - len(chunk))
    states = [state for _, state in chunk] + [0] * (ROUND - len(chunk))
    return [len(entries), len(chunk), *keys, *states]


def unpack_row(row: Sequence[int]) -> tuple[int, list[Entry]]:
    """(total, pairs) from a row that `pack_row` made."""
    total, used = int(row[0]), int(row[1])
    keys = row[_HEADER : _HEADER + ROUND]
    states = row[_HEADER + ROUND : _HEADER + 2 * ROUND]
    return total, [(int(keys[i]), int(states[i])) for i in range(used)]


def exchange(entries: Sequence[Entry], group: Any) -> list[list[Entry]]:
    """All-gather every rank's entries over `group` (a gloo CPU group) in fixed-shape rows. Every rank calls
    this, whatever it holds; the number of rows is agreed from the first one."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if world == 1:
        return [list(entries)]
    per_rank: list[list[Entry]] = [[] for _ in range(world)]
    index, rounds = 0, 1
    while index < rounds:
        row = torch.tensor(pack_row(entries, index), dtype=torch.int64)
        gathered = [torch.empty_like(row) for _ in range(world)]
        dist.all_gather(gathered, row, group=group)
        totals = []
        for rank, tensor in enumerate(gathered):
            total, pairs = unpack_row(tensor.tolist())
            totals.append(total)
            per_rank[rank].extend(pairs)
        if index == 0:
            rounds = rounds_needed(totals)
        index += 1
    return per_rank


@dataclasses.dataclass(frozen=True)
class _SGLang:
    """The few SGLang names the replacements use, bound when the patch is installed (never at import)."""

    poll: Callable[[list[Any]], list[int]]
    metadata_gate: Callable[[list[int], Any, Any], None]
    prepare_abort: Callable[..., None]
    status: Any


def _bind_sglang() -> _SGLang:
    from http import HTTPStatus

    from sglang.srt.disaggregation import utils

    return _SGLang(
        poll=utils._poll_with_failure_injection,
        metadata_gate=utils._apply_metadata_gate,
        prepare_abort=utils.prepare_abort,
        status=HTTPStatus.INTERNAL_SERVER_ERROR,
    )


def _local_polls(queue: Any, sg: _SGLang) -> list[int]:
    """This rank's own poll states, exactly as SGLang computes them before its all-reduce."""
    polls = sg.poll(queue._pollers())
    if queue.metadata_buffers is not None:
        sg.metadata_gate(polls, queue.queue, queue.metadata_buffers)
    return polls


def _drop_divergent(queue: Any, decode_req: Any, sg: _SGLang) -> None:
    """Abort a transfer that some peer no longer holds: SGLang's failed-transfer clean-up, without the
    `held` all-reduce (the peer that dropped it would not join it). The receiver is aborted first so the
    prefill side stops writing; where SGLang would hold the pages until prefill acknowledges that, they are
    held on this rank's own list (`dropped_holds`), else released at once."""
    reason = "KV transfer dropped: not held by every TP rank (pdfleet kv-poll-lockstep)"
    logger.warning("%s: rid=%s rank=%s", reason, decode_req.req.rid, queue.tp_rank)
    receiver = decode_req.kv_receiver
    if receiver is not None:
        receiver.abort()
    sg.prepare_abort(decode_req.req, reason, status_code=sg.status)
    queue.scheduler.output_streamer.stream_output([decode_req.req], decode_req.req.return_logprob)
    queue._clean_hicache_prefetch_resources(decode_req)
    queue._record_transfer_failure(reason)
    if dropped_holds.must_hold(queue, decode_req):
        dropped_holds.hold(queue, decode_req)
        return
    queue._release_request(decode_req)
    if receiver is not None:
        receiver.clear()
    decode_req.kv_receiver = None
    room = decode_req.req.bootstrap_room
    if queue.enable_staging and queue.staging_handler.is_staging_room(room):
        queue.staging_handler.unregister_decode_req(room)
    idx = decode_req.metadata_buffer_index
    if idx != -1:
        queue.metadata_buffers.clear_slot(idx)
        queue.req_to_metadata_buffer_idx_allocator.free(idx)


def _reconcile(queue: Any, keys: list[int], agreement: Agreement, sg: _SGLang) -> None:
    """Make this rank's queue the agreed one: drop what a peer lacks, keep the lead rank's order."""
    if tuple(keys) == agreement.order:
        return
    kept = {}
    for key, decode_req in zip(keys, queue.queue, strict=True):
        if key in agreement.states:
            kept[key] = decode_req
        else:
            _drop_divergent(queue, decode_req, sg)
    queue.queue = [kept[key] for key in agreement.order]


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The lockstep `pop_transferred` and the poll step that returns its agreed states; with them, the agreed
    retraction gate and the lockstep handshake poll (`prealloc_lockstep`), and the lockstep prefill polls
    (`prefill_lockstep`)."""
    from pdfleet.runtime.patches.impl import prealloc_lockstep, prefill_lockstep

    sg = _bind_sglang()
    original_pop = originals[POP_TRANSFERRED]
    original_poll = originals[POLL_WITH_METADATA_GATE]
    original_release = originals[RELEASE_MEMORY_OCCUPATION]

    @functools.wraps(original_pop)
    def pop_transferred(self: Any, rids_to_check: list[str] | None = None) -> list[Any]:
        if rids_to_check is not None:  # PP: follows the previous stage's consensus, unchanged
            return original_pop(self, rids_to_check)
        dropped_holds.release_due(self)  # rank-local: pages of earlier drops whose prefill side has let go
        keys = [request_key(decode_req.req.rid) for decode_req in self.queue]
        polls = _local_polls(self, sg)
        entries = list(zip(keys, polls, strict=True))
        agreement = agree(seams.in_collective(phases.Phase.DECODE_TRANSFER_EXCHANGE,
                                              lambda: exchange(entries, self.gloo_group)))
        _reconcile(self, keys, agreement, sg)
        setattr(self, _AGREED, agreement.states)
        try:
            return original_pop(self, rids_to_check)
        finally:
            setattr(self, _AGREED, None)

    @functools.wraps(original_poll)
    def _poll_with_metadata_gate(self: Any) -> list[int]:
        agreed = getattr(self, _AGREED, None)
        states = None if agreed is None else [agreed.get(request_key(d.req.rid)) for d in self.queue]
        if states is None or None in states:
            return original_poll(self)
        return states

    @functools.wraps(original_release)
    def release_memory_occupation(self: Any) -> Any:
        dropped_holds.forget(self)  # the pool is torn down: held pages go with it, as SGLang's own holds do
        return original_release(self)

    return {POP_TRANSFERRED: pop_transferred, POLL_WITH_METADATA_GATE: _poll_with_metadata_gate,
            RELEASE_MEMORY_OCCUPATION: release_memory_occupation,
            **prealloc_lockstep.replacements(originals), **prefill_lockstep.replacements(originals)}
