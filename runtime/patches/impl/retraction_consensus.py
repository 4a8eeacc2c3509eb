"""retraction-consensus: the ranks that share a running batch agree whether its next decode step fits in memory.

Why. `Scheduler.update_running_batch` (SGLang 0.5.23) asks `ScheduleBatch.check_decode_mem`, which reads this
rank's own KV allocator, and acts on the answer: a rank that finds the pool full skips the step (when requests
are finishing), or retracts requests until the step fits, each retraction again asking `check_decode_mem`
(`ScheduleBatch.retract_decode`); with decode KV offload it first enters
`DecodeKVCacheOffloadManager.drain_before_retraction`, two all-reduces over the batch's TP group. Ranks of one
TP group normally allocate identically, but nothing forces it (fragmentation, a leak, pages held on one rank for
a transfer it dropped). A rank that decides alone enters the drain's all-reduces its peers never enter (a hang),
or decodes a smaller batch than its peers (their forward's collectives no longer pair), and its retracted
request sits in its queue alone.

What the patch does: while `update_running_batch` runs, every `check_decode_mem` answer is MIN-all-reduced over
the ranks that share the batch (`Scheduler.dp_tp_cpu_group`, the group SGLang's offload manager reduces over):
the step fits only if it fits on every rank. Each answer is then the same on every rank, so every rank takes the
same branch at every check: all skip or none, all drain or none, and `retract_decode`'s loop (its order is
computed from the requests, equal on every rank) pops the same requests on every rank, until the step fits
everywhere. `check_decode_mem` outside `update_running_batch` is SGLang's own (its one other caller is the
mixed-chunk prefill path, `--enable-mixed-chunk`, which no PD loop takes). The cost: one all-reduce of one
int per decode step of a non-empty batch, one more per retracted request; the ledger records it as
DECODE_MEMORY_AGREEMENT.

The backup: with `--disaggregation-decode-retraction-backup host_pool` (what SGLang picks for an MHA decode
server when the flag is omitted), `retract_decode` asks `release_req` for each request it pops, and its answer is
whether this rank's host pool took the request's KV (`backup_kv_cache`: False when the pool is full after
reclaiming). True keeps the request retracted (resumed later from the backup), False aborts it. The host pools
are per rank, so a fuller one would abort a request its peers retract: the ranks' retracted queues (the retraction
gate's and resumption's input) and the request's fate differ. While `update_running_batch` runs, that answer is
MIN-all-reduced over the same group, inside the agreed loop (every rank pops the same request there): the request
stays retracted only if every rank backed it up. A rank that backed up a request the group aborts frees the
backup at once (`discard_kv_cache_backup`, SGLang's own release of it), so every rank takes the path SGLang takes
for a failed backup and no host slot leaks. The other backends' answers are computed from the request and the
launch config alone (equal on every rank) and are not reduced; `release_req` outside `update_running_batch`
(priority preemption) is SGLang's own. The cost: one more all-reduce of one int per request retracted with a
host-pool backup, also recorded as DECODE_MEMORY_AGREEMENT.

Not agreed here: which retracted requests resume (`DecodePreallocQueue.resume_retracted_reqs`, memory-local;
admission-consensus agrees it), in docs/desync-audit.md.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Mapping
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches.impl import gloo_min

PATCH_ID = "retraction-consensus"
UPDATE_RUNNING_BATCH = "sglang.srt.managers.scheduler.Scheduler.update_running_batch"
CHECK_DECODE_MEM = "sglang.srt.managers.schedule_batch.ScheduleBatch.check_decode_mem"
RETRACT_DECODE = "sglang.srt.managers.schedule_batch.ScheduleBatch.retract_decode"  # fingerprinted: its loop
BATCH_RELEASE_REQ = "sglang.srt.managers.schedule_batch.ScheduleBatch.release_req"
# Fingerprinted: release_req backs up (decode mode) then frees the device KV whatever the answer; backup_kv_cache's
# answer reads rank-local state only for host_pool; discard_kv_cache_backup is how a backup is given back.
RELEASE_REQ = "sglang.srt.managers.schedule_batch.release_req"
BACKUP_KV_CACHE = "sglang.srt.mem_cache.common.backup_kv_cache"
DISCARD_KV_CACHE_BACKUP = "sglang.srt.mem_cache.common.discard_kv_cache_backup"
TARGETS = (UPDATE_RUNNING_BATCH, CHECK_DECODE_MEM, RETRACT_DECODE, BATCH_RELEASE_REQ, RELEASE_REQ, BACKUP_KV_CACHE,
           DISCARD_KV_CACHE_BACKUP)
HOST_POOL = "host_pool"  # the one retraction backup whose success is per rank

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        UPDATE_RUNNING_BATCH: "289c1bd9057ca786",
        CHECK_DECODE_MEM: "14cbb57bc0ad75bb",
        RETRACT_DECODE: "578d1d97495f802e",
        BATCH_RELEASE_REQ: "5a21d297725bfd06",
        RELEASE_REQ: "8b5877a5ccb39124",
        BACKUP_KV_CACHE: "850800f592e56d1c",
        DISCARD_KV_CACHE_BACKUP: "fafd15b1e4ab77a7",
    },
}

# The group `check_decode_mem` agrees over while `update_running_batch` runs in this process (one scheduler per
# process; a context variable keeps a nested or concurrent caller from seeing another's group).
_AGREEING: contextvars.ContextVar[Any] = contextvars.ContextVar("pdfleet_retraction_group", default=None)


def agreed(yes: bool, group: Any) -> bool:
    """Every rank of `group` said yes (the step fits; the backup was taken): MIN of each rank's answer. Every
    rank calls this with the same group at the same question."""
    [every] = seams.in_collective(phases.Phase.DECODE_MEMORY_AGREEMENT,
                                  lambda: gloo_min.all_min([int(yes)], group))
    return bool(every)


def backs_up_to_host_pool(offload_kv: bool) -> bool:
    """`release_req` will try a host-pool backup: decode mode, a retraction that keeps the KV, backend
    host_pool. Launch config, read where SGLang reads it, so equal on every rank of the batch."""
    from sglang.srt.managers import schedule_batch

    disagg = schedule_batch.get_disagg()
    return (offload_kv and disagg.disaggregation_mode == "decode"
            and disagg.disaggregation_decode_retraction_backup == HOST_POOL)


def batch_group(scheduler: Any) -> Any:
    """The ranks that share this scheduler's running batch, or None when it has no peers."""
    import torch.distributed as dist

    group = getattr(scheduler, "dp_tp_cpu_group", None)
    if group is None or dist.get_world_size(group) <= 1:
        return None
    return group


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    original_update = originals[UPDATE_RUNNING_BATCH]
    original_check = originals[CHECK_DECODE_MEM]
    original_release = originals[BATCH_RELEASE_REQ]

    @functools.wraps(original_update)
    def update_running_batch(self: Any, batch: Any) -> Any:
        token = _AGREEING.set(batch_group(self))
        try:
            return original_update(self, batch)
        finally:
            _AGREEING.reset(token)

    @functools.wraps(original_check)
    def check_decode_mem(self: Any, selected_indices: list[int] | None = None) -> bool:
        fits = bool(original_check(self, selected_indices))
        group = _AGREEING.get()
        return fits if group is None else agreed(fits, group)

    @functools.wraps(original_release)
    def release_req(self: Any, idx: int, remaing_req_count: int, offload_kv: bool = True) -> bool:
        saved = bool(original_release(self, idx, remaing_req_count, offload_kv))
        group = _AGREEING.get()
        # Inside update_running_batch the one caller that keeps the KV is retract_decode's agreed loop, on the
        # request every rank popped: every rank reaches this reduction at the same request.
        if group is None or not backs_up_to_host_pool(offload_kv) or agreed(saved, group):
            return saved
        if saved:  # a peer could not back it up: the group aborts it, so this rank's backup would never be read
            from sglang.srt.mem_cache import common

            common.discard_kv_cache_backup(self.reqs[idx], self.tree_cache, HOST_POOL)
        return False

    return {UPDATE_RUNNING_BATCH: update_running_batch, CHECK_DECODE_MEM: check_decode_mem,
            BATCH_RELEASE_REQ: release_req}
