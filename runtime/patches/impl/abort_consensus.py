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
TARGETS = (PROCESS_INPUT_REQUESTS, ABORT_REQUEST, POLL_TIMEOUT_ABORTS)

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        PROCESS_INPUT_REQUESTS: "4abf9f52a087f303",
        ABORT_REQUEST: "e19c6b7a87fec58e",
        POLL_TIMEOUT_ABORTS: "2852859c0464edb9",
    },
}

_DEPTH = "_pdfleet_broadcast_depth"  # > 0 while the broadcast's requests are being applied
_PENDING = "_pdfleet_pending_aborts"  # the deciding rank's aborts waiting for its next broadcast


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


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The three replacements; `get_parallel` is bound here, when the patch is installed."""
    from sglang.srt.runtime_context import get_parallel

    original_process = originals[PROCESS_INPUT_REQUESTS]
    original_abort = originals[ABORT_REQUEST]
    original_poll = originals[POLL_TIMEOUT_ABORTS]

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
        return aborts

    return {
        PROCESS_INPUT_REQUESTS: process_input_requests,
        ABORT_REQUEST: abort_request,
        POLL_TIMEOUT_ABORTS: _poll_timeout_aborts,
    }
