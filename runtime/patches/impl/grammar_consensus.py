"""grammar-consensus: the ranks that share a batch agree on every grammar outcome before it changes the batch.

Why. Constrained decoding (json_schema, regex, ebnf, structural_tag) runs a grammar per request on every TP rank,
and two of its outcomes are rank-local in SGLang 0.5.23:
- Compilation. `GrammarManager.get_ready_grammar_requests` agrees *which* grammars are ready (an all_gather of
  queue indices), then each rank reads its own future: an exception or an invalid result on one rank aborts the
  request there alone, and caches the invalid grammar there alone, so every later request with that grammar is
  aborted at intake on that rank while its peers queue it; their grammar queues then differ in length and the
  index-based all_gather pairs different requests. Either way the ranks' batches differ and the next forward's
  collectives no longer pair.
- Token acceptance. `accept_token` raises when a grammar rejects the sampled token (SGLang's own comment calls it
  an unexpected xgrammar issue); the handlers abort the request on that rank alone. With per-rank sampling
  (see SYNC_TOKEN_IDS_ACROSS_TP in docs/desync-audit.md) the token itself may differ by rank.

What the patch does, at each place an outcome is decided (all over the ranks that share the batch: SGLang's
`get_dp_tp_group()`, the group its own grammar sync uses):
- Compilation: after SGLang's `get_ready_grammar_requests`, one all-reduce of the ready requests' "compiled"
  flags (ordered by request id). A grammar that compiled on some ranks only is, on every rank, dropped from the
  cache (the next request with it compiles afresh everywhere) and its request aborted, saying so. A grammar that
  failed everywhere is left as SGLang leaves it (cached invalid, aborted).
- Acceptance where SGLang defers the abort (`req.to_finish`, applied at the request's next finish check): one
  all-reduce per batch that has grammar requests, of "this rank aborts it" flags, and every rank aborts what any
  rank aborts, before the abort takes effect. The sites: `Scheduler.process_batch_result` (normal decode and
  non-disaggregated prefill accept inside it; their aborts apply in the next step),
  `SchedulerBatchResultProcessor.advance_grammar_fsm` (speculative decoding; its aborts apply in the same
  result's loop, so the agreement runs right after the advance) and
  `SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch` (a PD decode server accepting the first token its
  prefill peer sampled).
- Acceptance where SGLang acts at once: `process_batch_result_disagg_prefill` retires a rejected request on the
  spot and hands the others to the KV transfer. There every `accept_token` of the call is agreed as it happens (one
  all-reduce per grammar request of a prefill batch): a token rejected on any rank raises on every rank.

Cost: none for batches without grammar requests; with them, one all-reduce of one int per request per ready
grammar poll, one per batch step, one per grammar request of a disaggregated prefill batch. The ledger records
each as GRAMMAR_AGREEMENT. Not agreed: pipeline stages past the first (each agrees within its own TP group, as
SGLang's grammar sync does), and grammar-cache eviction (SGLang 0.5.23's cache is an unbounded dict).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches.impl import gloo_min

PATCH_ID = "grammar-consensus"
_PROCESSOR = "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
GET_READY = "sglang.srt.constrained.grammar_manager.GrammarManager.get_ready_grammar_requests"
PROCESS_BATCH_RESULT = "sglang.srt.managers.scheduler.Scheduler.process_batch_result"
ADVANCE_GRAMMAR_FSM = f"{_PROCESSOR}.advance_grammar_fsm"
NEW_PREBUILT_BATCH = "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch"
DISAGG_PREFILL_RESULT = (
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill")
# Fingerprinted, left as SGLang's: where the accepts this patch agrees happen, and that their aborts are deferred.
ACCEPT_GRAMMAR_TOKENS = f"{_PROCESSOR}._accept_grammar_tokens"
APPLY_PREFILL_GRAMMAR = f"{_PROCESSOR}._apply_prefill_grammar"
PROCESS_BATCH_RESULT_DECODE = f"{_PROCESSOR}.process_batch_result_decode"
PROCESS_PREBUILT = (
    "sglang.srt.disaggregation.decode_schedule_batch_mixin.ScheduleBatchDisaggregationDecodeMixin.process_prebuilt")
TARGETS = (GET_READY, PROCESS_BATCH_RESULT, ADVANCE_GRAMMAR_FSM, NEW_PREBUILT_BATCH, DISAGG_PREFILL_RESULT,
           ACCEPT_GRAMMAR_TOKENS, APPLY_PREFILL_GRAMMAR, PROCESS_BATCH_RESULT_DECODE, PROCESS_PREBUILT)
FINGERPRINTED_ONLY = (ACCEPT_GRAMMAR_TOKENS, APPLY_PREFILL_GRAMMAR, PROCESS_BATCH_RESULT_DECODE, PROCESS_PREBUILT)

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        GET_READY: "56f6d3a98b15e35a",
        PROCESS_BATCH_RESULT: "dd919e37863d3d4e",
        ADVANCE_GRAMMAR_FSM: "12c3d006ba1c152e",
        NEW_PREBUILT_BATCH: "d3ebcae52eb00721",
        DISAGG_PREFILL_RESULT: "f8ce20674721341d",
        ACCEPT_GRAMMAR_TOKENS: "6c0ea041bc201410",
        APPLY_PREFILL_GRAMMAR: "cd6750661dbe5faa",
        PROCESS_BATCH_RESULT_DECODE: "d6bfe2d59cfc0353",
        PROCESS_PREBUILT: "446d3137f2137bb0",
    },
}

SPLIT_COMPILE = "the grammar compiled on some tensor-parallel ranks of this engine and failed on others"
PEER_REJECTED = "another tensor-parallel rank of this engine's grammar rejected the sampled token"

ReduceMin = Callable[[Sequence[int], Any], list[int]]


def _agreed(values: Sequence[int], group: Any, reduce_min: ReduceMin) -> list[int]:
    return list(seams.in_collective(phases.Phase.GRAMMAR_AGREEMENT, lambda: reduce_min(values, group)))


# --- compilation ------------------------------------------------------------------------------------------------

def split_compiles(compiled_here: Sequence[bool], group: Any, reduce_min: ReduceMin) -> list[bool]:
    """For each request (the same list, in the same order, on every rank): whether its grammar compiled on some
    ranks of `group` and not on others. One reduction: the MIN of the flags and the MIN of their negations (the
    MAX), so every rank learns both "all compiled" and "any compiled"."""
    flags = [int(c) for c in compiled_here]
    reduced = _agreed(flags + [-f for f in flags], group, reduce_min)
    every, some = reduced[:len(flags)], [-v for v in reduced[len(flags):]]
    return [bool(s) and not e for e, s in zip(every, some, strict=True)]


def agree_compiled(manager: Any, reqs: Sequence[Any], invalid: type, reduce_min: ReduceMin) -> list[Any]:
    """After SGLang's ready-grammar poll: the requests whose grammar compiled on some ranks only, now aborted on
    every rank and out of every rank's cache. Whether a grammar compiled is read from the cache, where SGLang's
    poll leaves each ready grammar (a copy, or an invalid one); an aborted request no longer holds its own."""
    ordered = sorted(reqs, key=lambda r: r.rid)
    cache = manager.grammar_backend.cache
    compiled = [not isinstance(cache.get(req.grammar_key), invalid) for req in ordered]
    dropped = []
    for req, split in zip(ordered, split_compiles(compiled, manager.grammar_sync_group, reduce_min), strict=True):
        if split:
            cache.pop(req.grammar_key, None)
            if not req.finished():
                req.set_finish_with_abort(f"Failed to compile {req.grammar_key[0]} grammar: {SPLIT_COMPILE}")
            dropped.append(req)
    return dropped


# --- acceptance, deferred ---------------------------------------------------------------------------------------

def grammar_reqs(batch: Any) -> list[Any]:
    """The requests of `batch` that carry a grammar: the same on every rank that shares the batch (the batch is
    agreed, and whether a request has a grammar is decided at intake from its sampling params)."""
    return [req for req in batch.reqs if req.grammar is not None]


def agree_aborts(reqs: Sequence[Any], group: Any, abort: Callable[[], Any], reduce_min: ReduceMin) -> list[Any]:
    """Every rank aborts what any rank of `group` is about to abort (`to_finish` an abort) among `reqs`, before it
    takes effect. Returns the requests this rank now aborts because a peer did."""
    if not reqs:
        return []
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    pending = [isinstance(req.to_finish, FINISH_ABORT) for req in reqs]
    agreed = _agreed([0 if p else 1 for p in pending], group, reduce_min)
    joined = []
    for req, mine, everyone in zip(reqs, pending, agreed, strict=True):
        if not mine and not everyone and not req.finished():
            req.to_finish = abort()
            joined.append(req)
    return joined


# --- acceptance, immediate --------------------------------------------------------------------------------------

class AgreedAccept:
    """Stands in for a request's grammar while a disaggregated prefill result is processed: `accept_token` returns
    only if every rank of the group accepted the token, and raises ValueError (the error SGLang's handler catches)
    on every rank otherwise. Everything else reaches the grammar itself."""

    def __init__(self, grammar: Any, group: Any, reduce_min: ReduceMin) -> None:
        object.__setattr__(self, "_grammar", grammar)
        object.__setattr__(self, "_group", group)
        object.__setattr__(self, "_reduce_min", reduce_min)

    def accept_token(self, token: int) -> None:
        error: ValueError | None = None
        try:
            self._grammar.accept_token(token)
        except ValueError as e:
            error = e
        [everyone] = _agreed([int(error is None)], self._group, self._reduce_min)
        if not everyone:
            raise error or ValueError(PEER_REJECTED)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grammar, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._grammar, name, value)


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The five replacements; SGLang's classes and group accessor are bound here, when the patch is installed."""
    from sglang.srt.constrained.base_grammar_backend import InvalidGrammarObject
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.layers import dp_attention
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    def reduce_min(values: Sequence[int], group: Any) -> list[int]:
        return gloo_min.all_min(values, group)
    original_get_ready = originals[GET_READY]
    original_process = originals[PROCESS_BATCH_RESULT]
    original_advance = originals[ADVANCE_GRAMMAR_FSM]
    original_new_prebuilt = originals[NEW_PREBUILT_BATCH]
    original_disagg_prefill = originals[DISAGG_PREFILL_RESULT]

    def peer_rejected() -> Any:
        return FINISH_ABORT(f"Grammar accept_token failed: {PEER_REJECTED}", HTTPStatus.INTERNAL_SERVER_ERROR,
                            "InternalServerError")

    @functools.wraps(original_get_ready)
    def get_ready_grammar_requests(self: Any) -> list[Any]:
        reqs = original_get_ready(self)
        if reqs and self.grammar_sync_size > 1:
            agree_compiled(self, reqs, InvalidGrammarObject, reduce_min)
        return reqs

    @functools.wraps(original_process)
    def process_batch_result(self: Any, batch: Any, result: Any) -> Any:
        out = original_process(self, batch, result)
        # Skipped where the accepts were agreed already: inside advance_grammar_fsm (grammar_advanced), or one by
        # one (a disaggregated prefill). Both are the same on every rank that shares the batch.
        if not getattr(result, "grammar_advanced", False) and self.disaggregation_mode != DisaggregationMode.PREFILL:
            agree_aborts(grammar_reqs(batch), self.dp_tp_cpu_group, peer_rejected, reduce_min)
        return out

    @functools.wraps(original_advance)
    def advance_grammar_fsm(self: Any, result: Any, batch: Any) -> Any:
        before = result.grammar_advanced
        out = original_advance(self, result, batch)
        if not before and result.grammar_advanced:
            agree_aborts(grammar_reqs(batch), dp_attention.get_dp_tp_group().cpu_group, peer_rejected, reduce_min)
        return out

    @functools.wraps(original_new_prebuilt)
    def get_new_prebuilt_batch(self: Any, running_batch: Any) -> Any:
        batch = original_new_prebuilt(self, running_batch)
        if batch is not None:
            agree_aborts(grammar_reqs(batch), self.dp_tp_cpu_group, peer_rejected, reduce_min)
        return batch

    @functools.wraps(original_disagg_prefill)
    def process_batch_result_disagg_prefill(self: Any, batch: Any, result: Any) -> Any:
        reqs = grammar_reqs(batch)
        if not reqs:
            return original_disagg_prefill(self, batch, result)
        grammars = [req.grammar for req in reqs]
        for req, grammar in zip(reqs, grammars, strict=True):
            req.grammar = AgreedAccept(grammar, self.dp_tp_cpu_group, reduce_min)
        try:
            return original_disagg_prefill(self, batch, result)
        finally:
            for req, grammar in zip(reqs, grammars, strict=True):
                if isinstance(req.grammar, AgreedAccept):
                    req.grammar = grammar

    return {
        GET_READY: get_ready_grammar_requests,
        PROCESS_BATCH_RESULT: process_batch_result,
        ADVANCE_GRAMMAR_FSM: advance_grammar_fsm,
        NEW_PREBUILT_BATCH: get_new_prebuilt_batch,
        DISAGG_PREFILL_RESULT: process_batch_result_disagg_prefill,
    }
