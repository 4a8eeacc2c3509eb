"""The patch catalogue: what each pdfleet patch to SGLang is, where it applies, and what it replaces.

Plain data on purpose. The operator reads it to build the CRD's enum of patch ids and to refuse a patch that
does not apply to a pool's SGLang version; the launcher (inside SGLang's image, standard library only) reads it
to decide what to patch and to verify each target before touching it. Implementations live elsewhere and are
looked up by id, so this module never imports SGLang.

Version ranges are the releases a patch was checked against, not a promise: the launcher still verifies that
every target function looks as expected before it patches anything.
"""

from __future__ import annotations

import dataclasses
import re

_RELEASE = re.compile(r"^(\d+(?:\.\d+)*)(?:[.-]?(a|b|rc|dev|post)\.?(\d*))?(?:\+.*)?$")
# Pre-releases sort before the release, post-releases after it (PEP 440, reduced to what SGLang tags use).
_STAGE = {"dev": -4, "a": -3, "b": -2, "rc": -1, None: 0, "post": 1}


def version_key(version: str) -> tuple[tuple[int, ...], int, int]:
    """A sortable key for an SGLang version such as '0.5.23', '0.5.24rc1' or '0.5.23.post2'.

    Hand-rolled because the launcher cannot count on `packaging` inside every SGLang image.
    Raises ValueError for text that is not a version.
    """
    match = _RELEASE.match(version.strip())
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    release = tuple(int(part) for part in match.group(1).split("."))
    release = release + (0,) * (3 - len(release)) if len(release) < 3 else release
    stage, number = match.group(2), match.group(3)
    return release, _STAGE[stage], int(number) if number else 0


@dataclasses.dataclass(frozen=True)
class VersionRange:
    """Versions from `min` (inclusive) up to `below` (exclusive; None means no known upper bound)."""

    min: str
    below: str | None = None

    def __contains__(self, version: object) -> bool:
        if not isinstance(version, str):
            return False
        key = version_key(version)
        if key < version_key(self.min):
            return False
        return self.below is None or key < version_key(self.below)

    def __str__(self) -> str:
        return f">={self.min}" + (f",<{self.below}" if self.below else "")


@dataclasses.dataclass(frozen=True)
class Patch:
    """One catalogue entry.

    `targets` are dotted names (module path, then attribute path) of the functions the patch replaces; the
    launcher resolves and fingerprints each before patching. `fixed_in` is the first upstream release known to
    contain a fix, after which the patch is refused as redundant. `kv_layout` marks patches that change the
    layout of KV buffers: prefill and decode must then run the same patch set (they always do, since patches
    are set per pool), and a rollout that adds or removes one must not mix old and new groups behind a router.
    `unavailable` says why pdfleet refuses a known fix it has no implementation of yet: refused at admission and
    by the launcher, rather than engines started without the fix the spec asked for. `recommended` marks a fix
    every pool of a release it applies to should run: a pool whose `patchPolicy` is Recommended (the default)
    runs these without naming them (`recommended_for`). Patches that change the KV layout, serve one model
    family, or change nothing by themselves are never recommended.
    """

    id: str
    summary: str
    applies_to: VersionRange
    targets: tuple[str, ...]
    fixed_in: str | None = None
    upstream: tuple[str, ...] = ()
    kv_layout: bool = False
    unavailable: str | None = None
    recommended: bool = False


CATALOGUE: tuple[Patch, ...] = (
    Patch(
        id="kv-poll-lockstep",
        summary=(
            "Every TP rank joins the KV polls (decode transfer and prealloc handshake; prefill bootstrap, "
            "inflight, waiting-queue bootstrap and chunked-request bootstrap) on every loop iteration with a "
            "fixed-shape payload, even with an empty local queue, no chunked request or a retracted request on "
            "one rank, so ranks can never enter different collectives there."
        ),
        applies_to=VersionRange(min="0.5.0", below="0.6.0"),
        # Checked against 0.5.23: the decode transfer queue's poll (the overlap-abort desync), the decode
        # loop's retraction gate in front of every decode poll (agreed by a MAX all-reduce) and the prealloc
        # queue's handshake poll (the same fixed-shape exchange), and the prefill bootstrap and inflight queues'
        # polls, the waiting queue's bootstrap resolution and the chunked request's check_bootstrap (the
        # exchange over attention TP then CP; the chunked one entered from process_prefill_chunk, in front of
        # its `chunked_req is not None` gate). A transfer the decode exchange drops keeps its pages until the
        # prefill side lets go, on a rank-local list that release_memory_occupation (the KV pool torn down)
        # clears, as SGLang clears its own. Patching utils.poll_and_all_reduce would not reach decode.py or
        # prefill.py, which bind the name at import. Which requests each rank admits or moves on (memory,
        # metadata buffers) is not agreed here (docs/desync-audit.md).
        targets=(
            "sglang.srt.disaggregation.decode.DecodeTransferQueue.pop_transferred",
            "sglang.srt.disaggregation.decode.DecodeTransferQueue._poll_with_metadata_gate",
            "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.process_decode_queue",
            "sglang.srt.disaggregation.decode.DecodePreallocQueue._update_handshake_waiters",
            "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.pop_bootstrapped",
            "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue",
            "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.resolve_waiting_queue_bootstrap",
            "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_prefill_chunk",
            "sglang.srt.disaggregation.decode.DecodeTransferQueue.release_memory_occupation",
        ),
        upstream=("sgl-project/sglang#36893", "sgl-project/sglang#30760"),
        recommended=True,
    ),
    Patch(
        id="abort-consensus",
        summary=(
            "Rank 0 alone decides which requests to abort (client aborts and timeouts) and which sessions to "
            "reap (timed out on its clock), and broadcasts the list, so per-rank clocks and per-rank state "
            "cannot make ranks take different branches."
        ),
        applies_to=VersionRange(min="0.5.0", below="0.6.0"),
        # Checked against 0.5.23: where aborts take effect, where the broadcast is applied, the deciding rank's
        # hook into the broadcast (0.5.23 already sends timeout aborts that way), the session reaper every rank
        # runs on its own clock, and close_session, through which a broadcast reap is applied (fingerprinted).
        # Cost: none per iteration (the decisions ride the request broadcast); a CloseSessionReqInput per reap.
        targets=(
            "sglang.srt.managers.scheduler.Scheduler.process_input_requests",
            "sglang.srt.managers.scheduler.Scheduler.abort_request",
            "sglang.srt.managers.scheduler.Scheduler._poll_timeout_aborts",
            "sglang.srt.session.session_controller.SessionController.maybe_reap",
            "sglang.srt.managers.scheduler.Scheduler.close_session",
        ),
        upstream=("sgl-project/sglang#27221", "sgl-project/sglang#27164", "sgl-project/sglang#28039"),
        recommended=True,
    ),
    Patch(
        id="health-check-consensus",
        summary=(
            "The ranks that receive a health-check request agree whether they are idle (one MIN all-reduce, "
            "only in an iteration that carries one), so all queue it or all skip it instead of a busy rank "
            "skipping what its idle peers queue."
        ),
        applies_to=VersionRange(min="0.5.0", below="0.6.0"),
        # Checked against 0.5.23: is_fully_idle(for_health_check=True), whose one caller is the health-check
        # skip in process_input_requests (fingerprinted as the call site; abort-consensus replaces it). Cost:
        # one all-reduce of one int over the TP CPU group (with DP attention: attention TP, then CP) per
        # health-check request, none otherwise. Not covered: PP stages agree within their own TP group only.
        targets=(
            "sglang.srt.managers.scheduler.Scheduler.is_fully_idle",
            "sglang.srt.managers.scheduler.Scheduler.process_input_requests",
        ),
        recommended=True,
    ),
    Patch(
        id="retraction-consensus",
        summary=(
            "The ranks that share a decode batch agree whether its next step fits in KV memory (a MIN all-reduce "
            "per check), so they retract the same requests, skip or drain together, and never decode batches of "
            "different sizes because one rank's allocator is fuller; with a host-pool retraction backup they also "
            "agree whether each retracted request was backed up, so all keep it retracted or all abort it."
        ),
        applies_to=VersionRange(min="0.5.0", below="0.6.0"),
        # Checked against 0.5.23: update_running_batch (sets the group for its duration), check_decode_mem and
        # ScheduleBatch.release_req (agreed inside it; a backup the group aborts is discarded) are replaced;
        # retract_decode, whose loop asks check_decode_mem until the step fits and aborts a request release_req
        # could not back up, release_req, backup_kv_cache and discard_kv_cache_backup are fingerprinted. Cost:
        # one all-reduce of one int over the batch's TP CPU group per decode step of a non-empty batch, one more
        # per retracted request, one more per request retracted with a host-pool backup.
        targets=(
            "sglang.srt.managers.scheduler.Scheduler.update_running_batch",
            "sglang.srt.managers.schedule_batch.ScheduleBatch.check_decode_mem",
            "sglang.srt.managers.schedule_batch.ScheduleBatch.retract_decode",
            "sglang.srt.managers.schedule_batch.ScheduleBatch.release_req",
            "sglang.srt.managers.schedule_batch.release_req",
            "sglang.srt.mem_cache.common.backup_kv_cache",
            "sglang.srt.mem_cache.common.discard_kv_cache_backup",
        ),
        recommended=True,
    ),
    Patch(
        id="admission-consensus",
        summary=(
            "The ranks of a group agree their free capacity before admitting requests: decode before "
            "preallocating or resuming (KV, request slots, metadata buffers, host pools, radix-cache, HiSparse and "
            "Mamba capacity), prefill before giving a bootstrapped request a metadata buffer and before building "
            "each prefill batch, so one rank's fuller pools never make it admit, chunk, move on or resume requests "
            "alone."
        ),
        applies_to=VersionRange(min="0.5.0", below="0.6.0"),
        # Checked against 0.5.23: pop_preallocated, resume_retracted_reqs and Scheduler._get_new_batch_prefill_raw
        # are replaced (each runs SGLang's own body with the pools' capacity readers clamped to the group's
        # smallest); _allocatable_token_budgets and PrefillBudget._available_and_evictable, which read the pools
        # for them, are fingerprinted. Cost: one all-reduce of seventeen integers per call: two per decode
        # iteration, one per prefill iteration; ensure_metadata_buffer is replaced (one all-reduce of one
        # integer per prefill request that needs a buffer). LoRA slots need no agreement (they follow the
        # broadcast); the decode host-receive threshold's pool usage is read through the clamped readers.
        targets=(
            "sglang.srt.disaggregation.decode.DecodePreallocQueue.pop_preallocated",
            "sglang.srt.disaggregation.decode.DecodePreallocQueue.resume_retracted_reqs",
            "sglang.srt.disaggregation.decode.DecodePreallocQueue._allocatable_token_budgets",
            "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.ensure_metadata_buffer",
            "sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw",
            "sglang.srt.mem_cache.prefill_budget.PrefillBudget._available_and_evictable",
        ),
        recommended=True,
    ),
    Patch(
        id="flush-consensus",
        summary=(
            "The ranks a cache flush reaches agree whether to flush now, defer, flush a deferred one or give it "
            "up (one MIN all-reduce of their idleness and the leader's deadline), so no rank clears its radix "
            "tree, pools and grammar cache while its peers keep theirs."
        ),
        applies_to=VersionRange(min="0.5.0", below="0.6.0"),
        # Checked against 0.5.23: SchedulerFlushWrapper.handle (dispatched from the broadcast) and check_pending
        # (every iteration from process_input_requests; agreed only while a flush is pending) are replaced and run
        # SGLang's own body on the agreed answers; the wrapper's constructor, Scheduler.init_running_status (which
        # hands it the scheduler's bound methods) and Scheduler.flush_cache (the idleness check the immediate path
        # agrees) are fingerprinted. Cost: one all-reduce of two integers per flush request and per iteration
        # while a deferred flush waits, over the TP CPU group (with DP attention: attention TP, then CP); none
        # otherwise.
        targets=(
            "sglang.srt.managers.scheduler_components.flush_wrapper.SchedulerFlushWrapper.handle",
            "sglang.srt.managers.scheduler_components.flush_wrapper.SchedulerFlushWrapper.check_pending",
            "sglang.srt.managers.scheduler_components.flush_wrapper.SchedulerFlushWrapper.__init__",
            "sglang.srt.managers.scheduler.Scheduler.flush_cache",
            "sglang.srt.managers.scheduler.Scheduler.init_running_status",
        ),
        recommended=True,
    ),
    Patch(
        id="grammar-consensus",
        summary=(
            "The ranks that share a batch agree on every grammar outcome before it changes the batch: a grammar "
            "that compiled on some ranks only is aborted and uncached on all, and a token any rank's grammar "
            "rejects aborts the request on every rank, so constrained decoding (JSON schema, regex, EBNF, "
            "structural tags) can no longer leave one rank with a different batch."
        ),
        applies_to=VersionRange(min="0.5.0", below="0.6.0"),
        # Checked against 0.5.23: GrammarManager.get_ready_grammar_requests (compile results read per rank after
        # the agreed ready poll), Scheduler.process_batch_result (normal decode and prefill accepts, aborts
        # deferred to the next step), SchedulerBatchResultProcessor.advance_grammar_fsm (speculative accepts),
        # SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch (a PD decode server's first-token accept) and
        # process_batch_result_disagg_prefill (acts on a rejection at once) are replaced; the accept helpers,
        # process_batch_result_decode and process_prebuilt are fingerprinted. Cost: none without grammar requests;
        # one all-reduce per ready-grammar poll and per batch step with grammar requests, one per grammar request
        # of a disaggregated prefill batch.
        targets=(
            "sglang.srt.constrained.grammar_manager.GrammarManager.get_ready_grammar_requests",
            "sglang.srt.managers.scheduler.Scheduler.process_batch_result",
            "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
            ".advance_grammar_fsm",
            "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch",
            "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin"
            ".process_batch_result_disagg_prefill",
            "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
            "._accept_grammar_tokens",
            "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
            "._apply_prefill_grammar",
            "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
            ".process_batch_result_decode",
            "sglang.srt.disaggregation.decode_schedule_batch_mixin.ScheduleBatchDisaggregationDecodeMixin"
            ".process_prebuilt",
        ),
        recommended=True,
    ),
    Patch(
        id="overlap-loop-report",
        summary=(
            "Records which event loop each scheduler rank selected (overlap, normal or pp) in the rank-health "
            "ledger, so a rollout can verify that every rank runs the expected loop. Part of the rank "
            "instrumentation the launcher always installs; selecting it changes nothing."
        ),
        applies_to=VersionRange(min="0.5.0", below="0.6.0"),
        # A module-level function, looked up as a global by `dispatch_event_loop` and the PD role-switch
        # supervisor on every dispatch, so replacing the module attribute reaches every caller.
        targets=("sglang.srt.managers.scheduler._dispatch_event_loop_once",),
    ),
    Patch(
        id="dsml-batch-decode-guard",
        summary=(
            "Decodes the detokenizer's batch grouped by (skip_special_tokens, spaces_between_special_tokens), "
            "so a tool request batched behind a plain request keeps its DSML markers and tool calls never leak "
            "into content."
        ),
        # 0.5.0 to 0.5.7 decode a batch with request 0's options; 0.5.7's --disable-tokenizer-batch-decode
        # still does for mixed batches. Fingerprinted for the releases its tests run (0.5.6.post2, 0.5.7).
        applies_to=VersionRange(min="0.5.0", below="0.5.8"),
        targets=("sglang.srt.managers.detokenizer_manager.DetokenizerManager.handle_batch_token_id_out",),
        fixed_in="0.5.8",
        upstream=("sgl-project/sglang#16698", "sgl-project/sglang#15155", "sgl-project/sglang#11944"),
        recommended=True,
    ),
    Patch(
        id="dsml-leak-guard",
        summary=(
            "Guards OpenAI chat responses against DeepSeek DSML tool-call markup in content (whole or with its "
            "special tokens stripped), streaming and not: counts each leak by cause in "
            "pdfleet_toolcall_leaks_total, logs a sample a minute, and with PDFLEET_TOOLCALL_SALVAGE=1 turns "
            "well-formed calls into tool_calls and gives an output cut inside its calls one answer streamed or "
            "not: the calls complete before the cut, never one whose arguments are not JSON (docs/toolcalls.md)."
        ),
        applies_to=VersionRange(min="0.5.23", below="0.6.0"),
        # Checked against 0.5.23: the property the HTTP server asks for its chat class (replaced by one that
        # returns pdfleet's subclass); the two methods that subclass wraps and the stream loop that calls one
        # of them are fingerprinted, not replaced.
        targets=(
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.serving_chat_class",
            "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._build_chat_response",
            "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._generate_stream_content",
            "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._generate_chat_stream",
        ),
        upstream=("sgl-project/sglang#35736", "sgl-project/sglang#17593", "sgl-project/sglang#38233"),
    ),
    Patch(
        id="bf16-index-keys",
        summary=(
            "Stores DeepSeek V3.2's DSA indexer keys in bf16 (256 B per token per layer instead of 132) and scores "
            "them with pdfleet's fused Triton kernels (per-head ReLU, fp32 accumulation), replacing DeepGEMM's FP8 "
            "kernels, which exist for SM90 and SM100 only; refused at engine start for DeepSeek V4's indexer."
        ),
        applies_to=VersionRange(min="0.5.23", below="0.6.0"),
        # Checked against 0.5.23 (runtime/patches/impl/bf16_index_keys.py says what each target is for): the
        # index-key buffer's shape and its two sizers (GPU cell size, HiCache host bytes), the writers, the token
        # move and ragged gather, the decode logits, the prefill logits function, the DeepGEMM switch, V4's
        # indexer buffer and the sliding-window configurator (both refused); then the call sites and byte-level
        # consumers, fingerprinted only.
        targets=(
            "sglang.srt.mem_cache.index_key_cache.IndexKeyCache._buffer_shape",
            "sglang.srt.mem_cache.index_key_cache.IndexKeyCache.move",
            "sglang.srt.mem_cache.index_key_cache.IndexKeyCache.get_k_and_scale",
            "sglang.srt.mem_cache.index_key_cache.IndexKeyCache.store_quantized",
            "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._store_index_k_cache",
            "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._fused_k_prepare_and_store",
            "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._get_topk_paged",
            "sglang.srt.layers.attention.dsa.dsa_indexer.resolve_fp8_mqa_logits_fn",
            "sglang.srt.layers.attention.dsa.utils._use_torch_mqa_logits",
            "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_dsa_indexer_cell_size",
            "sglang.srt.mem_cache.pool_host.dsa.dsa_indexer_bytes_per_token_per_layer",
            "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4IndexerPool._create_buffer",
            "sglang.srt.model_executor.pool_configurator.HybridSWAPoolConfigurator.__init__",
            "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._get_topk_ragged",
            "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer.forward_cuda",
            "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._forward_cuda_k_only",
            "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._fused_q_prepare_and_store",
            "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._get_index_k_read_buffer",
            "sglang.srt.mem_cache.index_key_cache.IndexKeyCache.__init__",
            "sglang.srt.mem_cache.index_key_cache.IndexKeyCache._kernel_view",
            "sglang.srt.mem_cache.index_key_cache.IndexKeyCache.state_buf_infos",
            "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool.__init__",
            "sglang.srt.mem_cache.pool_host.dsa.make_dsa_indexer_pool_decl",
        ),
        upstream=("sgl-project/sglang#24692", "sgl-project/sglang#33271"),
        kv_layout=True,
    ),
)

BY_ID: dict[str, Patch] = {patch.id: patch for patch in CATALOGUE}
# The SGLang releases pdfleet's runtime instruments (the rank-health seams are fingerprinted per release, and
# an engine of another release refuses to start): the keys of `instrument.rank_seams.FINGERPRINTS`, kept here
# as plain data for admission; a unit test holds the two equal.
INSTRUMENTED: tuple[str, ...] = ("0.5.23",)
IDS: tuple[str, ...] = tuple(patch.id for patch in CATALOGUE)
UNAVAILABLE: dict[str, str] = {patch.id: patch.unavailable for patch in CATALOGUE if patch.unavailable}


def applies(patch: Patch, version: str) -> bool:
    """Whether `patch` can run on SGLang `version`: in its range, implemented, and not made redundant upstream."""
    if patch.unavailable or version not in patch.applies_to:
        return False
    return patch.fixed_in is None or version_key(version) < version_key(patch.fixed_in)


def recommended_for(version: str) -> tuple[str, ...]:
    """The fixes a pool of SGLang `version` runs unless it opts out, in catalogue order (the order the launcher
    applies them in). Empty for a version no patch applies to, or one that is not a version."""
    try:
        version_key(version)
    except ValueError:
        return ()
    return tuple(patch.id for patch in CATALOGUE if patch.recommended and applies(patch, version))
