"""abort-consensus: one rank decides every abort, and all ranks act on it in the same iteration.

Why. Aborting a request changes rank-local queues (SGLang 0.5.23 `Scheduler.abort_request` pops it from the
waiting queue, aborts its KV receiver, or marks it `to_finish`), and the queues decide which collectives a
rank enters next (the `if not self.queue` guards in front of the KV-poll all-reduce, batch or idle in front of
the forward). So an abort acted on by one rank alone (a per-rank clock for a timeout, a local error handler,
any caller of `abort_request` outside the request broadcast) makes that rank take other branches than its
peers: the desync of upstream #27221 / #28039. SGLang 0.5.23 already routes *timeout* aborts this way
(`_poll_timeout_aborts` runs on the attention-TP leader only and its aborts ride the request broadcast); this
patch makes that the only way for every abort.

How, with three targets on `Scheduler`:
- `process_input_requests`: marks the scheduler as "applying the broadcast" while it dispatches the requests
  every rank received in the same `broadcast_pyobj`.
- `abort_request`: inside the broadcast, the original runs (every rank runs it, same iteration). Anywhere
  else it is a rank-local decision: the deciding rank (pp 0, attention-TP 0, attention-CP 0: the rank whose
  requests every peer receives) queues it for its next broadcast; any other rank ignores it, because the
  decider sees the same request and decides for all.
- `_poll_timeout_aborts`: the deciding rank's hook into the broadcast (`ingest_requests` passes its result to
  `recv_requests(local_reqs=...)`); it now also carries the queued decisions.

Session reaping is the same kind of decision and takes the same route (a fourth target,
`SessionController.maybe_reap`). SGLang closes timed-out sessions (and sessions whose deferred close is due) on
every rank from `process_input_requests`, each on its own `time.monotonic()` (`maybe_reap`'s one-second interval,
`Session.is_timed_out`): a rank that reaps a session a moment before its peers aborts the next request for it
while they build it and enter `_process_and_broadcast_mm_inputs`' broadcast (or batch it) without that rank.
Patched, only the deciding rank runs SGLang's own selection, on its own clock; the sessions it picks are not
closed there but queued as `CloseSessionReqInput`s for its next broadcast, so every rank closes them through
SGLang's `Scheduler.close_session` (fingerprinted) at the same point of the same iteration; any other rank reaps
nothing itself. No collective is added: the decision rides the broadcast every iteration already has.

A consequence worth knowing: SGLang's own deterministic re-dispatch (`process_pending_chunked_abort`, prefill)
calls `abort_request` outside the broadcast on every rank; it is now applied one broadcast later, on every
rank together.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

PATCH_ID = "abort-consensus"
PROCESS_INPUT_REQUESTS = "sglang.srt.managers.scheduler.Scheduler.process_input_requests"
ABORT_REQUEST = "sglang.srt.managers.scheduler.Scheduler.abort_request"
POLL_TIMEOUT_ABORTS = "sglang.srt.managers.scheduler.Scheduler._poll_timeout_aborts"
MAYBE_REAP = "sglang.srt.session.session_controller.SessionController.maybe_reap"
CLOSE_SESSION = "sglang.srt.managers.scheduler.Scheduler.close_session"  # fingerprinted: how a reap is applied
TARGETS = (PROCESS_INPUT_REQUESTS, ABORT_REQUEST, POLL_TIMEOUT_ABORTS, MAYBE_REAP, CLOSE_SESSION)
FINGERPRINTED_ONLY = (CLOSE_SESSION,)  # verified at install, left as SGLang's

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        PROCESS_INPUT_REQUESTS: "4abf9f52a087f303",
        ABORT_REQUEST: "e19c6b7a87fec58e",
        POLL_TIMEOUT_ABORTS: "2852859c0464edb9",
        MAYBE_REAP: "9069a43fa5edd66d",
        CLOSE_SESSION: "bbbfbc1c84bdb786",
    },
}

_DEPTH = "_pdfleet_broadcast_depth"  # > 0 while the broadcast's requests are being applied
_PENDING = "_pdfleet_pending_aborts"  # the deciding rank's aborts waiting for its next broadcast
# On a SessionController (the deciding rank's): sessions picked for reaping, waiting for the next broadcast, and
# those that left in this iteration's broadcast (applied after this iteration's maybe_reap, so not picked again).
_REAPS_QUEUED = "_pdfleet_reaps_queued"
_REAPS_SENT = "_pdfleet_reaps_sent"


class Route(enum.Enum):
    """What a rank does with one call of `abort_request`."""

    APPLY = "apply"  # it came with the broadcast: every rank applies it now
    DEFER = "defer"  # the deciding rank's own decision: broadcast it next iteration
    IGNORE = "ignore"  # another rank's local decision: the deciding rank decides


def route(*, from_broadcast: bool, decider: bool) -> Route:
    """Pure: the route of an abort, from where it came and which rank sees it."""
    if from_broadcast:
        return Route.APPLY
    return Route.DEFER if decider else Route.IGNORE


def is_decider(parallel: Any) -> bool:
    """The rank whose requests its peers receive: the condition `Scheduler.ingest_requests` uses for
    `_poll_timeout_aborts`. With DP attention, each DP group's leader decides for its own group."""
    return parallel.pp_rank == 0 and parallel.attn_tp_rank == 0 and parallel.attn_cp_rank == 0


def pending_aborts(scheduler: Any) -> list[Any]:
    """The deciding rank's queued aborts (created on first use)."""
    pending = getattr(scheduler, _PENDING, None)
    if pending is None:
        pending = []
        setattr(scheduler, _PENDING, pending)
    return pending


def _reaps(controller: Any, name: str) -> list[str]:
    reaps = getattr(controller, name, None)
    if reaps is None:
        reaps = []
        setattr(controller, name, reaps)
    return reaps


def new_reaps(picked: list[str], *, queued: list[str], sent: list[str]) -> list[str]:
    """Pure: the sessions to queue for closing, from SGLang's pick, without those already on their way."""
    on_the_way = set(queued) | set(sent)
    return [sid for sid in dict.fromkeys(picked) if sid not in on_the_way]


def pick_reaps(original_reap: Callable[..., Any], controller: Any, now: float, interval: float) -> list[str]:
    """The sessions SGLang's own `maybe_reap` would close now, on this rank's clock, leaving them open: its
    `_close` records instead, and the `close_on_finish` it resets before a deferred close is put back (the
    close itself, on every rank, resets it again)."""
    picked: list[str] = []
    closing = {sid: session.close_on_finish for sid, session in controller.sessions.items()}
    controller._close = picked.append  # shadows SessionController._close for this call only
    try:
        original_reap(controller, now, interval)
    finally:
        del controller._close
        for sid, flag in closing.items():
            if sid in controller.sessions:
                controller.sessions[sid].close_on_finish = flag
    return picked


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The four replacements; `get_parallel` is bound here, when the patch is installed."""
    from sglang.srt.managers.io_struct import CloseSessionReqInput
    from sglang.srt.runtime_context import get_parallel

    original_process = originals[PROCESS_INPUT_REQUESTS]
    original_abort = originals[ABORT_REQUEST]
    original_poll = originals[POLL_TIMEOUT_ABORTS]
    original_reap = originals[MAYBE_REAP]

    @functools.wraps(original_process)
    def process_input_requests(self: Any, recv_reqs: list[Any]) -> Any:
        setattr(self, _DEPTH, getattr(self, _DEPTH, 0) + 1)
        try:
            return original_process(self, recv_reqs)
        finally:
            setattr(self, _DEPTH, getattr(self, _DEPTH) - 1)

    @functools.wraps(original_abort)
    def abort_request(self: Any, recv_req: Any) -> Any:
        decision = route(from_broadcast=getattr(self, _DEPTH, 0) > 0, decider=is_decider(get_parallel()))
        if decision is Route.APPLY:
            return original_abort(self, recv_req)
        if decision is Route.DEFER:
            pending_aborts(self).append(recv_req)
            logger.debug("abort of rid=%s queued for the next broadcast", getattr(recv_req, "rid", None))
        else:
            logger.info("rank-local abort of rid=%s ignored: the deciding rank aborts for all ranks",
                        getattr(recv_req, "rid", None))
        return None

    @functools.wraps(original_poll)
    def _poll_timeout_aborts(self: Any) -> list[Any]:
        aborts = list(original_poll(self))
        pending = pending_aborts(self)
        if pending:
            aborts.extend(pending)
            pending.clear()
        controller = getattr(self, "session_controller", None)
        if controller is not None:
            queued = _reaps(controller, _REAPS_QUEUED)
            aborts.extend(CloseSessionReqInput(session_id=sid) for sid in queued)
            setattr(controller, _REAPS_SENT, list(queued))
            queued.clear()
        return aborts

    @functools.wraps(original_reap)
    def maybe_reap(self: Any, now: float, interval: float = 1.0) -> None:
        if not is_decider(get_parallel()):
            return  # this rank closes what the deciding rank's broadcast says, when it says
        queued = _reaps(self, _REAPS_QUEUED)
        picked = new_reaps(pick_reaps(original_reap, self, now, interval), queued=queued,
                           sent=_reaps(self, _REAPS_SENT))
        setattr(self, _REAPS_SENT, [])  # applied by this iteration's dispatch, after this call
        if picked:
            logger.info("sessions %s reaped on the deciding rank's clock; closed by the next broadcast", picked)
            queued.extend(picked)

    return {
        PROCESS_INPUT_REQUESTS: process_input_requests,
        ABORT_REQUEST: abort_request,
        POLL_TIMEOUT_ABORTS: _poll_timeout_aborts,
        MAYBE_REAP: maybe_reap,
    }
