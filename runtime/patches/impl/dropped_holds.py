"""kv-poll-lockstep: a transfer the lockstep drops keeps its KV pages until no prefill rank can write them.

Why. When one rank no longer holds a transfer its peers still wait on, `kv_poll_lockstep` drops it on those
peers (`_drop_divergent`). Their pages were published to the prefill side, which may still be writing into
them. SGLang 0.5.23 never frees such pages at once on its own failure path: with deferred release
(`SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE`, on by default for the mooncake, mori and nixl back-ends)
it holds them until every prefill rank acknowledges the abort, or a timeout passes
(`DecodeTransferQueue._defer_release`, `resolve_deferred_releases`); pages received into host memory are held
until the host drain says so, with no timeout (a timeout cannot prove a remote write stopped). Freeing them
at once, as the first version of the drop did, hands pages to the next request while a write may still land.

Why not SGLang's own hold list: `resolve_deferred_releases` MIN-all-reduces one flag per held entry, so that
list must be equal on every rank, and a dropped transfer is dropped only on the ranks that still held it. So
the drop keeps a second list on the queue, rank-local and without any collective: each poll (every call of the
patched `pop_transferred`) releases the entries whose drain is acknowledged or whose deadline passed, with
SGLang's own release (`DecodeTransferQueue._do_release`: pages, metadata slot, the ack tracker, the receiver).
Held pages are not allocatable on this rank until then, which is the point; what that does to admission is the
memory-local admission the audit describes (docs/desync-audit.md).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)

_HOLDS = "_pdfleet_dropped_holds"  # the queue attribute holding this rank's list


@dataclasses.dataclass(frozen=True)
class Hold:
    """A dropped transfer whose pages wait for the prefill side. `deadline` is None for a host destination,
    released only once drained."""

    decode_req: Any
    since: float
    deadline: float | None
    metadata_index: int
    required_acks: int


def must_hold(queue: Any, decode_req: Any) -> bool:
    """Whether SGLang's failure path would hold this transfer's pages, after its abort notification went out:
    a host destination always; a device one when deferred release is on and the prefill side was notified."""
    receiver = decode_req.kv_receiver
    if receiver is None:
        return False
    if queue._is_host_destination(decode_req):
        return True
    deferrable = bool(queue.enable_deferred_kv_release
                      and getattr(receiver.kv_mgr, "enable_deferred_decode_kv_release", False))
    if deferrable and not receiver.abort_notified:
        # As SGLang's own failed-transfer path does: arm the ack tracker even when metadata went out partly.
        receiver.ensure_abort_notified(force_arm=True)
    return deferrable and bool(receiver.abort_notified)


def holds(queue: Any) -> list[Hold]:
    """This rank's held drops (empty when none was ever held)."""
    return list(getattr(queue, _HOLDS, None) or ())


def hold(queue: Any, decode_req: Any, now: float | None = None) -> Hold:
    """Keep `decode_req`'s pages and metadata slot until `release_due` finds them safe to free."""
    since = time.monotonic() if now is None else now
    host = queue._is_host_destination(decode_req)
    receiver = decode_req.kv_receiver
    entry = Hold(
        decode_req=decode_req, since=since, metadata_index=decode_req.metadata_buffer_index,
        deadline=None if host else since + float(queue.deferred_kv_release_timeout),
        required_acks=0 if host or not receiver.abort_notified else len(receiver.bootstrap_infos),
    )
    setattr(queue, _HOLDS, [*holds(queue), entry])
    return entry


def forget(queue: Any) -> None:
    """Drop every hold without releasing it: `DecodeTransferQueue.release_memory_occupation` is tearing the KV
    pool down (SGLang clears its own hold list there too); a later release would free pages of a pool that is
    gone."""
    setattr(queue, _HOLDS, [])


def _drained(entry: Hold) -> bool:
    receiver = entry.decode_req.kv_receiver
    if entry.deadline is None:
        return bool(receiver.is_abort_release_safe())
    return bool(receiver.kv_mgr.is_abort_release_safe(entry.decode_req.req.bootstrap_room, entry.required_acks))


def release_due(queue: Any, now: float | None = None) -> int:
    """Release every held drop whose prefill side acknowledged the abort, or whose deadline passed; returns how
    many were released. Rank-local: no collective, whatever the other ranks hold."""
    entries = holds(queue)
    if not entries:
        return 0
    at = time.monotonic() if now is None else now
    due, kept = [], []
    for entry in entries:
        drained = _drained(entry)
        if drained or (entry.deadline is not None and at >= entry.deadline):
            due.append((entry, drained))
        else:
            kept.append(entry)
    # Commit the survivors first, as SGLang does, so a failed release is never retried on a cleared receiver.
    setattr(queue, _HOLDS, kept)
    for entry, drained in due:
        room = entry.decode_req.req.bootstrap_room
        if not drained:
            logger.warning("KV pages of dropped transfer (room %s) released after %.0f s without a full drain ack "
                           "from prefill (pdfleet kv-poll-lockstep)", room, at - entry.since)
        outcome = "drained" if drained else "timeout"
        try:
            queue._do_release(entry.decode_req, entry.metadata_index)
        except Exception:
            logger.exception("releasing the KV pages of dropped transfer (room %s) failed", room)
            outcome = "error"
        queue._observe_deferred_kv_release(duration_seconds=max(0.0, at - entry.since), outcome=outcome)
    return len(due)
