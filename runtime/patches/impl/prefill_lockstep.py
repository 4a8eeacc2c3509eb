"""kv-poll-lockstep, part three: the prefill loop's KV polls, entered by every rank on every call.

Why. Four bootstrap/transfer polls of SGLang 0.5.23's prefill loop are guarded by a rank-local check
(docs/desync-audit.md):
- `PrefillBootstrapQueue.pop_bootstrapped` starts with `if len(self.queue) == 0: return []`, then
  MIN-all-reduces one bootstrap state per queued request over the attention-TP group, then the attention-CP
  group (`poll_and_all_reduce_attn_cp_tp_group`).
- `SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue` starts with
  `if len(self.disagg_prefill_inflight_queue) == 0: return []`, then the same poll over the transfers in flight.
- `SchedulerDisaggregationPrefillMixin.resolve_waiting_queue_bootstrap` polls the senders of the waiting
  queue's requests that are not aborted, after `if not candidates: return`.
- `SchedulerDisaggregationPrefillMixin.check_bootstrap` polls the chunked request's sender unless
  `not req.pending_bootstrap`, and its caller `process_prefill_chunk` calls it only when
  `self.chunked_req is not None`.
A rank whose queue, chunked request or flag differs on its own (an abort acted on by that rank alone, a failed
sender released at once, a batch its own memory admitted) skips the poll its peers wait in, or reduces a list
of another length: the group hangs, as on the decode side.

What the patch does instead, on every call and on every rank whatever it holds: each rank polls its own
senders (SGLang's `_poll_with_failure_injection`), then the ranks exchange fixed-shape rows of (request key,
state) with `kv_poll_lockstep.exchange`, over the attention-TP group and then the attention-CP group, as
SGLang's poll reduces. A request held by every rank gets the MIN of their states; one missing on some rank
gets Failed (it cannot complete there), so SGLang's own failure path (`handle_bootstrap_failure`, directly or
through `handle_pending_bootstrap`; `handle_inflight_transfer_failure`) retires it on every rank that still
holds it. 0.5.23's own body then runs unchanged, its poll step answering the agreed states: for the duration
of the call, the prefill module's `poll_and_all_reduce_attn_cp_tp_group` (the name the bodies look up when
they run) is a stand-in that returns them for exactly those senders and defers to the real poll for any other
list. The chunked request's exchange is entered from `process_prefill_chunk`, in front of its
`self.chunked_req is not None` gate (a rank-local abort empties that slot on one rank only), not from
`check_bootstrap`, which a rank without a chunked request never reaches. The PP paths (`pp_size > 1`,
`rids_to_check`) follow the pipeline's consensus and are passed through unchanged. Each exchange is one
collective in the rank-health ledger, PREFILL_BOOTSTRAP_EXCHANGE, PREFILL_INFLIGHT_EXCHANGE,
PREFILL_WAITING_BOOTSTRAP_EXCHANGE or PREFILL_CHUNK_BOOTSTRAP_EXCHANGE, as the instrumentation marks SGLang's
own polls (PREFILL_BOOTSTRAP_POLL, PREFILL_INFLIGHT_POLL, PREFILL_WAITING_BOOTSTRAP_POLL,
PREFILL_CHUNK_BOOTSTRAP_POLL).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches.impl import kv_poll_lockstep as lockstep
from pdfleet.runtime.patches.impl import prealloc_lockstep

# Targets and fingerprints are declared with the patch's others, in `kv_poll_lockstep`.
POP_BOOTSTRAPPED = lockstep.POP_BOOTSTRAPPED
PROCESS_INFLIGHT = lockstep.PROCESS_INFLIGHT
RESOLVE_WAITING_BOOTSTRAP = lockstep.RESOLVE_WAITING_BOOTSTRAP
PROCESS_PREFILL_CHUNK = lockstep.PROCESS_PREFILL_CHUNK
# The name 0.5.23's prefill bodies call their poll by, looked up in the prefill module at call time.
_POLL_NAME = "poll_and_all_reduce_attn_cp_tp_group"


def agreed_states(local: Sequence[lockstep.Entry], exchanges: Sequence[Callable[[list[lockstep.Entry]],
                  list[list[lockstep.Entry]]]], failed: int) -> dict[int, int]:
    """Key -> state agreed over each group in turn (attention-TP, then attention-CP): the MIN over the ranks
    holding a request, `failed` for one some rank lacks. Every rank calls every exchange."""
    entries = list(local)
    states: dict[int, int] = dict(entries)
    for exchange in exchanges:
        states = prealloc_lockstep.handshake_states(exchange(entries), failed)
        entries = [(key, states[key]) for key, _ in entries]
    return {key: states[key] for key, _ in local}


@contextlib.contextmanager
def _answering(module: Any, senders: list[Any], states: list[int]) -> Iterator[None]:
    """While inside, `module.poll_and_all_reduce_attn_cp_tp_group` returns `states` for exactly `senders`
    (the same objects, in order) and defers to the function it replaced for any other list."""
    real = getattr(module, _POLL_NAME)

    def poll(pollers: Any, attn_cp_cpu_group: Any, attn_tp_cpu_group: Any) -> Any:
        if len(pollers) == len(senders) and all(p is s for p, s in zip(pollers, senders, strict=True)):
            return list(states)
        return real(pollers, attn_cp_cpu_group, attn_tp_cpu_group)

    setattr(module, _POLL_NAME, poll)
    try:
        yield
    finally:
        setattr(module, _POLL_NAME, real)


def waiting_candidates(waiting_queue: Sequence[Any], is_aborted: Callable[[Any], bool]) -> list[Any]:
    """The requests `resolve_waiting_queue_bootstrap` polls, in its order: the waiting ones not aborted."""
    return [req for req in waiting_queue if not is_aborted(req)]


def pending_chunk(chunked_req: Any) -> list[Any]:
    """The requests `process_prefill_chunk` polls through `check_bootstrap`: the chunked request while its
    bootstrap is pending, else none."""
    return [chunked_req] if chunked_req is not None and chunked_req.pending_bootstrap else []


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The lockstep bootstrap, inflight, waiting-queue and chunked-request polls; SGLang's names are bound
    here."""
    from sglang.srt.disaggregation import prefill

    poll = lockstep._bind_sglang().poll
    failed = int(prefill.KVPoll.Failed)
    original_pop = originals[POP_BOOTSTRAPPED]
    original_inflight = originals[PROCESS_INFLIGHT]
    original_waiting = originals[RESOLVE_WAITING_BOOTSTRAP]
    original_chunk = originals[PROCESS_PREFILL_CHUNK]

    def lockstep_states(reqs: list[Any], cp_group: Any, tp_group: Any, phase: phases.Phase) -> list[int]:
        keys = [lockstep.request_key(req.rid) for req in reqs]
        local = list(zip(keys, poll([req.disagg_kv_sender for req in reqs]), strict=True))
        exchanges = [functools.partial(lockstep.exchange, group=tp_group),
                     functools.partial(lockstep.exchange, group=cp_group)]
        agreed = seams.in_collective(phase, lambda: agreed_states(local, exchanges, failed))
        return [agreed[key] for key in keys]

    @functools.wraps(original_pop)
    def pop_bootstrapped(self: Any) -> list[Any]:
        if self.pp_size > 1:  # PP: follows the pipeline's consensus, unchanged
            return original_pop(self)
        reqs = list(self.queue)
        states = lockstep_states(reqs, self.scheduler.attn_cp_cpu_group, self.scheduler.attn_tp_cpu_group,
                                 phases.Phase.PREFILL_BOOTSTRAP_EXCHANGE)
        with _answering(prefill, [req.disagg_kv_sender for req in reqs], states):
            return original_pop(self)

    @functools.wraps(original_inflight)
    def process_disagg_prefill_inflight_queue(self: Any, rids_to_check: list[str] | None = None) -> list[Any]:
        if rids_to_check is not None:  # PP: follows the previous stage's consensus, unchanged
            return original_inflight(self, rids_to_check)
        reqs = list(self.disagg_prefill_inflight_queue)
        states = lockstep_states(reqs, self.attn_cp_cpu_group, self.attn_tp_cpu_group,
                                 phases.Phase.PREFILL_INFLIGHT_EXCHANGE)
        with _answering(prefill, [req.disagg_kv_sender for req in reqs], states):
            return original_inflight(self, rids_to_check)

    @functools.wraps(original_waiting)
    def resolve_waiting_queue_bootstrap(self: Any) -> None:
        reqs = waiting_candidates(self.waiting_queue, prefill.is_aborted)
        states = lockstep_states(reqs, self.attn_cp_cpu_group, self.attn_tp_cpu_group,
                                 phases.Phase.PREFILL_WAITING_BOOTSTRAP_EXCHANGE)
        with _answering(prefill, [req.disagg_kv_sender for req in reqs], states):
            original_waiting(self)

    @functools.wraps(original_chunk)
    def process_prefill_chunk(self: Any, last_batch: Any, running_batch: Any) -> None:
        if prefill.get_parallel().pp_size > 1:  # PP: its own loop and microbatches, unchanged
            original_chunk(self, last_batch=last_batch, running_batch=running_batch)
            return
        reqs = pending_chunk(self.chunked_req)
        states = lockstep_states(reqs, self.attn_cp_cpu_group, self.attn_tp_cpu_group,
                                 phases.Phase.PREFILL_CHUNK_BOOTSTRAP_EXCHANGE)
        with _answering(prefill, [req.disagg_kv_sender for req in reqs], states):
            original_chunk(self, last_batch=last_batch, running_batch=running_batch)

    return {POP_BOOTSTRAPPED: pop_bootstrapped, PROCESS_INFLIGHT: process_disagg_prefill_inflight_queue,
            RESOLVE_WAITING_BOOTSTRAP: resolve_waiting_queue_bootstrap, PROCESS_PREFILL_CHUNK: process_prefill_chunk}
