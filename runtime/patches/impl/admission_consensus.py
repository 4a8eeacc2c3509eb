"""admission-consensus: the ranks that share a decode prealloc queue admit and resume the same requests, and
the ranks of a prefill group move the same requests out of their bootstrap queues and into the same batches.

Why. Which requests a decode rank preallocates (`DecodePreallocQueue.pop_preallocated`: moved on to the
transfer queue) and which retracted requests it resumes (`DecodePreallocQueue.resume_retracted_reqs`) is decided,
request by request, from this rank's own free capacity: free KV tokens (`token_to_kv_pool_allocator`, through
`_allocatable_token_budgets`), free request slots (`req_to_token_pool`) and free metadata buffers
(`req_to_metadata_buffer_idx_allocator`). Ranks of one TP group normally have the same free capacity, but nothing
forces it (fragmentation, pages held on one rank for a dropped transfer, a leak). A rank with less admits fewer:
`kv-poll-lockstep` then aborts the request its peers moved on (it is not held by every rank), or, for a resumed
request, the ranks decode different batches and their forward's collectives no longer pair.

What the patch does: at the start of each of the two calls, the ranks MIN-all-reduce a fixed vector of their free
capacities over the queue's group (the group SGLang's handshake poll reduces over), and for the duration of the
call each capacity reader answers its real value minus this rank's surplus over the smallest (`slack`). Every
rank then starts from the same capacity and, deciding on the same queue with the same requests, takes the same
branches and allocates the same amounts, so the answers stay equal through the call. The surplus is not lost:
the readers are SGLang's own again afterwards. One all-reduce of a few integers per call, two per decode
iteration (ledger phase ADMISSION_AGREEMENT).

Prefill: `PrefillBootstrapQueue.pop_bootstrapped` moves a request on (to the waiting queue, to be prefilled) only
once `ensure_metadata_buffer` found it a free metadata buffer on this rank; a rank with none left keeps it while its
peers move it, so their bootstrap and waiting queues differ (unpatched, one rank then polls a queue its peers
skip: a hang; with `kv-poll-lockstep`, the request is failed on every rank). The patch agrees that one answer:
when a request needs a buffer, the ranks MIN-all-reduce "I have one" over the attention-TP group, then the
attention-CP group, as the bootstrap poll reduces (phase ADMISSION_AGREEMENT), and allocate only if every rank
can. Every call of `ensure_metadata_buffer` comes from a branch taken on agreed poll states, and a request that
already holds a buffer needs no agreement, so every rank asks the same questions in the same order.

Prefill admission: `Scheduler._get_new_batch_prefill_raw` (replaced) builds the next prefill batch with SGLang's
`PrefillAdder`, which takes waiting requests, and decides whether to chunk one, by this rank's own free KV tokens and
evictable radix-cache tokens (`PrefillBudget`), free request slots (`get_num_allocatable_reqs`) and Mamba slots. A rank
with less takes fewer: its batch, and so its forward, differ from its peers', and the request it left waiting is
failed on the others by `kv-poll-lockstep`. The patch agrees the same capacity vector at the start of every call
(attention TP, then attention CP: the ranks that build one batch) and clamps the readers for the call, as on decode;
the radix cache's own eviction inside the call reads the clamped sizes too, so every rank evicts alike. One
all-reduce per call, one per prefill iteration, entered whether or not anything waits: a queue-emptiness gate in
front of it would be the very kind of branch this patch set removes.

Agreed readers, in a fixed order (a reader an object lacks counts 0 on every rank; one object reached by two paths
counts once): the KV allocator's `available_size`, `full_available_size`, `swa_available_size` (and the unified SWA
pool's `conserve_*` variants), HiSparse's device
allocator, the request slots and their Mamba slots, the decode host pools (`--disaggregation-decode-host-receive-
threshold`), the metadata buffers (decode), and the radix cache's evictable sizes (full, SWA, Mamba; decode's with
`--disaggregation-decode-enable-radix-cache`). SGLang's pool-usage observer reads the same allocator and radix
cache through these readers (for SWA pools through `swa_capacity_and_available`, which calls them), so the
host-receive threshold's usage is agreed with them (the unified SWA pool's `current_*_capacity` is its clamped
free size plus its allocated count, which follows the agreed allocations). LoRA slots need no
agreement: adapters load through the broadcast and the running set follows the agreed batches. The PP path
(`pp_size > 1`) follows the pipeline's consensus and is passed through.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches.impl import gloo_min

PATCH_ID = "admission-consensus"
POP_PREALLOCATED = "sglang.srt.disaggregation.decode.DecodePreallocQueue.pop_preallocated"
RESUME_RETRACTED = "sglang.srt.disaggregation.decode.DecodePreallocQueue.resume_retracted_reqs"
ALLOCATABLE_BUDGETS = "sglang.srt.disaggregation.decode.DecodePreallocQueue._allocatable_token_budgets"  # checked
ENSURE_METADATA_BUFFER = "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.ensure_metadata_buffer"
PREFILL_ADMISSION = "sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw"
PREFILL_BUDGET = "sglang.srt.mem_cache.prefill_budget.PrefillBudget._available_and_evictable"  # checked
TARGETS = (POP_PREALLOCATED, RESUME_RETRACTED, ALLOCATABLE_BUDGETS, ENSURE_METADATA_BUFFER, PREFILL_ADMISSION,
           PREFILL_BUDGET)

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        POP_PREALLOCATED: "b9905e593525ae62",
        RESUME_RETRACTED: "d85f66df1e512238",
        ALLOCATABLE_BUDGETS: "f22540486a78f6c4",
        ENSURE_METADATA_BUFFER: "af49e2a51061f56e",
        PREFILL_ADMISSION: "cc447dbdf748b6ac",
        PREFILL_BUDGET: "0f8a1220faecb84c",
    },
}

# (owner path from the queue or scheduler, reader): the capacities agreed, in a fixed order.
READERS: tuple[tuple[str, str], ...] = (
    ("token_to_kv_pool_allocator", "available_size"),
    ("token_to_kv_pool_allocator", "full_available_size"),
    ("token_to_kv_pool_allocator", "swa_available_size"),
    ("token_to_kv_pool_allocator", "conserve_full_available_size"),
    ("token_to_kv_pool_allocator", "conserve_swa_available_size"),
    ("token_to_kv_pool_allocator.hisparse_attn_allocator", "available_size"),
    ("req_to_token_pool", "available_size"),
    ("req_to_token_pool.mamba_allocator", "schedulable_available_size"),
    ("req_to_token_pool.mamba_allocator", "available_size"),
    ("token_to_kv_pool_allocator.mamba_allocator", "schedulable_available_size"),
    ("host_pool", "available_size"),
    ("host_swa_pool", "available_size"),
    ("req_to_metadata_buffer_idx_allocator", "available_size"),
    ("tree_cache", "evictable_size"),
    ("tree_cache", "full_evictable_size"),
    ("tree_cache", "swa_evictable_size"),
    ("tree_cache", "mamba_evictable_size"),
)

ReduceMin = Callable[[list[int], Any], list[int]]
_CLASS_READER = object()  # the reader was the class's method, not an attribute of the instance


def slack(mine: Sequence[int], agreed: Sequence[int]) -> list[int]:
    """How much each of this rank's capacities exceeds the smallest of the group's (never negative)."""
    return [max(0, m - a) for m, a in zip(mine, agreed, strict=True)]


def _owner(root: Any, path: str) -> Any:
    for attr in path.split("."):
        root = getattr(root, attr, None)
        if root is None:
            return None
    return root


def _readers(root: Any) -> list[tuple[Any, str] | None]:
    out: list[tuple[Any, str] | None] = []
    seen: set[tuple[int, str]] = set()
    for path, name in READERS:
        owner = _owner(root, path)
        if owner is None or not callable(getattr(owner, name, None)) or (id(owner), name) in seen:
            out.append(None)  # counted once, and clamped once, however many paths reach it
            continue
        seen.add((id(owner), name))
        out.append((owner, name))
    return out


@contextlib.contextmanager
def agreed_capacity(root: Any, group: Any, reduce_min: ReduceMin) -> Iterator[list[int]]:
    """While inside, each capacity reader of the pools `root` (a prealloc queue, a scheduler) holds answers its
    real value minus this rank's surplus over the group's smallest; yields the surpluses. Every rank of `group`
    must enter with the same call."""
    readers = _readers(root)
    mine = [int(getattr(r[0], r[1])()) if r is not None else 0 for r in readers]
    surplus = slack(mine, seams.in_collective(phases.Phase.ADMISSION_AGREEMENT, lambda: reduce_min(mine, group)))
    clamped: list[tuple[Any, str, Any]] = []
    for reader, extra in zip(readers, surplus, strict=True):
        if reader is None or extra == 0:
            continue
        owner, name = reader
        clamped.append((owner, name, vars(owner).get(name, _CLASS_READER)))
        setattr(owner, name, functools.partial(_less, getattr(owner, name), extra))
    try:
        yield surplus
    finally:
        for owner, name, before in clamped:
            if before is _CLASS_READER:
                delattr(owner, name)  # the class's own reader again
            else:
                setattr(owner, name, before)


def _less(real: Callable[[], int], extra: int) -> int:
    return int(real()) - extra


def over_groups(values: list[int], groups: Sequence[Any], reduce_min: ReduceMin = gloo_min.all_min) -> list[int]:
    """The element-wise MIN over every rank of every group in turn (attention TP, then attention CP): each rank
    of the second group already holds its first group's MIN, so the result is the MIN over all of them."""
    for group in groups:
        values = reduce_min(values, group)
    return values


def every_rank_can(mine: bool, groups: Sequence[Any], reduce_min: ReduceMin) -> bool:
    """True only if every rank of every group answered yes."""
    return bool(over_groups([int(mine)], groups, reduce_min)[0])


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    original_pop = originals[POP_PREALLOCATED]
    original_resume = originals[RESUME_RETRACTED]
    original_ensure = originals[ENSURE_METADATA_BUFFER]
    original_prefill = originals[PREFILL_ADMISSION]

    @functools.wraps(original_pop)
    def pop_preallocated(self: Any, rids_to_check: list[str] | None = None, pp_good_rids: list[str] | None = None,
                         pp_bad_rids: list[str] | None = None) -> Any:
        if self.pp_size > 1:  # PP: the pipeline's consensus decides, unchanged
            return original_pop(self, rids_to_check, pp_good_rids, pp_bad_rids)
        with agreed_capacity(self, self.gloo_group, gloo_min.all_min):
            return original_pop(self, rids_to_check, pp_good_rids, pp_bad_rids)

    @functools.wraps(original_resume)
    def resume_retracted_reqs(self: Any, rids_to_check: list[str] | None = None) -> Any:
        if self.pp_size > 1:
            return original_resume(self, rids_to_check)
        with agreed_capacity(self, self.gloo_group, gloo_min.all_min):
            return original_resume(self, rids_to_check)

    @functools.wraps(original_ensure)
    def ensure_metadata_buffer(self: Any, req: Any) -> bool:
        if req.metadata_buffer_index >= 0 or self.pp_size > 1:  # holds one already; PP: unchanged
            return bool(original_ensure(self, req))
        scheduler = self.scheduler
        groups = [scheduler.attn_tp_cpu_group, scheduler.attn_cp_cpu_group]
        mine = self.req_to_metadata_buffer_idx_allocator.available_size() > 0
        agreed = seams.in_collective(phases.Phase.ADMISSION_AGREEMENT,
                                     lambda: every_rank_can(mine, groups, gloo_min.all_min))
        return bool(original_ensure(self, req)) if agreed else False

    @functools.wraps(original_prefill)
    def get_new_batch_prefill_raw(self: Any, prefill_delayer_single_pass: Any, running_batch: Any) -> Any:
        from sglang.srt.runtime_context import get_parallel

        if get_parallel().pp_size > 1:  # PP: the pipeline's consensus decides, unchanged
            return original_prefill(self, prefill_delayer_single_pass=prefill_delayer_single_pass,
                                    running_batch=running_batch)
        with agreed_capacity(self, (self.attn_tp_cpu_group, self.attn_cp_cpu_group), over_groups):
            return original_prefill(self, prefill_delayer_single_pass=prefill_delayer_single_pass,
                                    running_batch=running_batch)

    return {POP_PREALLOCATED: pop_preallocated, RESUME_RETRACTED: resume_retracted_reqs,
            ENSURE_METADATA_BUFFER: ensure_metadata_buffer, PREFILL_ADMISSION: get_new_batch_prefill_raw}
