"""The instrumentation's seams in SGLang: which function gets which wrapper, and the fingerprint it must have.

A patch implementation in the shape `patches.base.Implementation` describes (`FINGERPRINTS`,
`replacements`), applied by `instrument.apply` rather than through the catalogue because it is not a choice.

Names are patched where they are looked up: `from x import f` copies the reference into the importing module,
so the request broadcast is replaced in `request_receiver` (not in `sglang.srt.utils.common`, where it is
defined) and the KV polls in `disaggregation.prefill`, `disaggregation.decode` and `scheduler_pp_mixin`, the
modules whose loops call them. Functions those call in turn (`utils.poll_and_all_reduce` inside
`poll_and_all_reduce_attn_cp_tp_group`, `utils.all_reduce_flags` inside every poll) stay unwrapped, so each
logical collective counts once; `decode.all_reduce_flags` is only the name the decode queues call directly.

A KV poll, and a flag reduction a decode queue calls directly (`decode.all_reduce_flags`), is recorded under
the phase of the audited caller that entered it (`SITES`, see `seams`), so a desync verdict names the queue a
rank waits in, not just "a KV poll". So is `torch.distributed.all_gather_object` when the grammar queue
(`GrammarManager.get_ready_grammar_requests`) or `Scheduler._gather_vmm_materialization_errors` enters it;
seamed there because both call it inline (the grammar gather sits between a rank-local poll for compiled
grammars and the PP hand-off, so wrapping the caller would mark local work as a collective). Any other caller
of it is not marked.

Left out on purpose: `decode.poll_and_all_reduce_pp` (maps a consensus already reached over the pipeline;
no collective of its own) and the loop dispatcher (the `overlap-loop-report` catalogue patch, see
`patches.impl.overlap_loop_report`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from types import CodeType
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches import targets

_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_RECEIVER = "sglang.srt.managers.scheduler_components.request_receiver"
_PREFILL = "sglang.srt.disaggregation.prefill"
_DECODE = "sglang.srt.disaggregation.decode"
_PP_MIXIN = "sglang.srt.managers.scheduler_pp_mixin"
_OFFLOAD = "sglang.srt.disaggregation.decode_kvcache_offload_manager.DecodeKVCacheOffloadManager"
# torch's, not SGLang's: SGLang looks it up on `torch.distributed` at each call, so this is where its scheduler
# callers find it. torch is pinned by the SGLang release (0.5.23: torch 2.14.1), so the pin below is too.
_ALL_GATHER_OBJECT = "torch.distributed.all_gather_object"

WRAPPERS: dict[str, Callable[..., seams.Fn]] = {
    f"{_SCHEDULER}.ingest_requests": seams.ingest_requests,
    f"{_SCHEDULER}.run_batch": seams.run_batch,
    f"{_SCHEDULER}.on_idle": seams.on_idle,
    f"{_RECEIVER}.broadcast_pyobj": seams.broadcast_pyobj,
    f"{_RECEIVER}.attn_cp_tp_broadcast_pyobj": seams.attn_cp_tp_broadcast_pyobj,
    f"{_PREFILL}.poll_and_all_reduce_attn_cp_tp_group": seams.poll_and_all_reduce_attn_cp_tp_group,
    f"{_PREFILL}.poll_and_all_reduce_prefill_pp": seams.poll_and_all_reduce_prefill_pp,
    f"{_DECODE}.poll_and_all_reduce": seams.poll_and_all_reduce,
    f"{_DECODE}.poll_and_all_reduce_with_staging": seams.poll_and_all_reduce_with_staging,
    f"{_DECODE}.all_reduce_flags": seams.all_reduce_flags,
    f"{_PP_MIXIN}.poll_and_all_reduce_attn_cp_tp_group": seams.poll_and_all_reduce_attn_cp_tp_group,
    "sglang.srt.managers.scheduler_components.dp_attn.MLPSyncBatchInfo.all_gather": seams.mlp_sync_all_gather,
    f"{_OFFLOAD}.drain_before_retraction": seams.offload_drain,
    f"{_OFFLOAD}.check_offload_progress": seams.offload_progress,
    _ALL_GATHER_OBJECT: seams.all_gather_object,
}

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        f"{_SCHEDULER}.ingest_requests": "4ba77891bd6e4a76",
        f"{_SCHEDULER}.run_batch": "6bb492e110c3e875",
        f"{_SCHEDULER}.on_idle": "851656223a6826f6",
        f"{_RECEIVER}.broadcast_pyobj": "a5aa8858f2f8ef64",
        f"{_RECEIVER}.attn_cp_tp_broadcast_pyobj": "a2fef272ed8cc947",
        f"{_PREFILL}.poll_and_all_reduce_attn_cp_tp_group": "6003aaa2ccaa631a",
        f"{_PREFILL}.poll_and_all_reduce_prefill_pp": "8946ee09910fcc32",
        f"{_DECODE}.poll_and_all_reduce": "c8c7f64e3a736618",
        f"{_DECODE}.poll_and_all_reduce_with_staging": "74bd768e4c060c4e",
        f"{_DECODE}.all_reduce_flags": "9184eae4a9a6eb5a",
        f"{_PP_MIXIN}.poll_and_all_reduce_attn_cp_tp_group": "6003aaa2ccaa631a",
        "sglang.srt.managers.scheduler_components.dp_attn.MLPSyncBatchInfo.all_gather": "1b05fef0b29417fe",
        f"{_OFFLOAD}.drain_before_retraction": "f165f14fa5eea894",
        f"{_OFFLOAD}.check_offload_progress": "9ccbabd4e7ceea23",
        _ALL_GATHER_OBJECT: "b181d8e1016a370b",
    },
}


# The seams whose wrapper records the caller's phase (`seams.Sites`).
_SITED = frozenset({
    f"{_PREFILL}.poll_and_all_reduce_attn_cp_tp_group",
    f"{_DECODE}.poll_and_all_reduce",
    f"{_DECODE}.poll_and_all_reduce_with_staging",
    f"{_DECODE}.all_reduce_flags",
    _ALL_GATHER_OBJECT,
})
_MIXIN = f"{_PREFILL}.SchedulerDisaggregationPrefillMixin"

# SGLang's callers of the KV polls, flag reductions and object all-gathers above that the desync audit names
# (docs/desync-audit.md), and the phase a rank waiting in a collective one of them entered is recorded under.
SITES: Mapping[str, phases.Phase] = {
    f"{_DECODE}.DecodePreallocQueue._update_handshake_waiters": phases.Phase.PREALLOC_HANDSHAKE_POLL,
    f"{_DECODE}.DecodeTransferQueue._poll_with_metadata_gate": phases.Phase.DECODE_TRANSFER_POLL,
    f"{_DECODE}.DecodeTransferQueue._poll_with_staging": phases.Phase.DECODE_TRANSFER_POLL,
    f"{_PREFILL}.PrefillBootstrapQueue.pop_bootstrapped": phases.Phase.PREFILL_BOOTSTRAP_POLL,
    f"{_MIXIN}.process_disagg_prefill_inflight_queue": phases.Phase.PREFILL_INFLIGHT_POLL,
    f"{_MIXIN}.resolve_waiting_queue_bootstrap": phases.Phase.PREFILL_WAITING_BOOTSTRAP_POLL,
    f"{_MIXIN}.check_bootstrap": phases.Phase.PREFILL_CHUNK_BOOTSTRAP_POLL,
    f"{_DECODE}.DecodeTransferQueue.pop_transferred": phases.Phase.FAILED_TRANSFER_FLAGS,
    f"{_DECODE}.DecodeTransferQueue.resolve_deferred_releases": phases.Phase.DEFERRED_RELEASE_FLAGS,
    f"{_DECODE}.SchedulerDisaggregationDecodeMixin._verify_kv_checksums": phases.Phase.KV_CHECKSUM_FLAGS,
    "sglang.srt.constrained.grammar_manager.GrammarManager.get_ready_grammar_requests":
        phases.Phase.GRAMMAR_READY_GATHER,
    f"{_SCHEDULER}._gather_vmm_materialization_errors": phases.Phase.VMM_ERROR_GATHER,
}


def sglang_code(function: Callable[..., Any]) -> CodeType:
    """The code object that runs when SGLang's function runs: under any pdfleet patch (`base.mark` keeps
    each original; a patch that defers to the original runs it) and any `functools.wraps` decorator."""
    while getattr(function, "__pdfleet_patch__", None) is not None:
        function = function.__wrapped_original__  # type: ignore[attr-defined]
    code: CodeType = inspect.unwrap(function).__code__
    return code


def sites_by_code() -> seams.Sites:
    """`SITES` by code object. A caller the installed SGLang lacks is left out (its collectives then record
    the seam's default, KV_POLL_ALL_REDUCE or OTHER_COLLECTIVE): a label is never a reason to refuse
    instrumenting a rank."""
    sites = {}
    for dotted, phase in SITES.items():
        with contextlib.suppress(targets.TargetError):
            sites[sglang_code(targets.resolve(dotted).function)] = phase
    return sites


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """dotted target -> its wrapper around `originals[dotted]` (the function installed there now)."""
    sites = sites_by_code()
    return {dotted: WRAPPERS[dotted](function, sites) if dotted in _SITED else WRAPPERS[dotted](function)
            for dotted, function in originals.items()}
