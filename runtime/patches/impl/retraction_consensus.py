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

Not agreed here: whether a retracted request keeps a host backup (`release_req` with
`--disaggregation-decode-retraction-backup host_pool` reads the host pool: one rank may retract a request another
aborts), and which retracted requests resume (`DecodePreallocQueue.resume_retracted_reqs`, memory-local); both
are in docs/desync-audit.md.
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
TARGETS = (UPDATE_RUNNING_BATCH, CHECK_DECODE_MEM, RETRACT_DECODE)

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        UPDATE_RUNNING_BATCH: "289c1bd9057ca786",
        CHECK_DECODE_MEM: "14cbb57bc0ad75bb",
        RETRACT_DECODE: "578d1d97495f802e",
    },
}

# The group `check_decode_mem` agrees over while `update_running_batch` runs in this process (one scheduler per
# process; a context variable keeps a nested or concurrent caller from seeing another's group).
_AGREEING: contextvars.ContextVar[Any] = contextvars.ContextVar("pdfleet_retraction_group", default=None)


def agreed(fits: bool, group: Any) -> bool:
    """The step fits on every rank of `group`: MIN of each rank's answer. Every rank calls this with the
    same group at the same check."""
    [every] = seams.in_collective(phases.Phase.DECODE_MEMORY_AGREEMENT,
                                  lambda: gloo_min.all_min([int(fits)], group))
    return bool(every)


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

    return {UPDATE_RUNNING_BATCH: update_running_batch, CHECK_DECODE_MEM: check_decode_mem}
