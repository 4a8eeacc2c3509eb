"""health-check-consensus: every rank that received a health-check request queues it, or every one drops it.

Why. SGLang 0.5.23's `Scheduler.process_input_requests` skips a health-check generate request on a busy rank
(`if is_health_check_generate_req(req) and not self.is_fully_idle(for_health_check=True): continue`) and
queues it, as a generate request, on an idle one. The request reached every rank of the group in the same
broadcast, but `is_fully_idle` reads rank-local state: the running batch, the waiting queue, the last batch,
the result queue and, on a decode rank, the retracted queue (which each rank's own allocators fill). Ranks
that disagree on idleness end the intake with different queues (the decode prealloc queue, the prefill
bootstrap queue, the waiting queue), and the guarded KV polls or the forward behind them are where the group
hangs.

How. `is_fully_idle(for_health_check=True)` has exactly one caller in 0.5.23, that branch, and it is reached
only for a health-check request that came in the request broadcast, at the same position in the same list on
every rank of the group that shares the broadcast. The replacement computes the rank's own answer, then MIN-
all-reduces it (1 idle, 0 busy) over that group, so every rank gets "idle" only if all of them are: all queue
the request or all drop it (a dropped one is answered as SGLang answers it, its IPC noted for a reply). The
group: without DP attention the request broadcast covers the TP CPU group; with DP attention a health check is
a work request, which `attn_cp_tp_broadcast_pyobj` sends along one DP group's attention-CP and attention-TP
groups, so the MIN runs over the attention-TP CPU group and then the attention-CP one (a group of one rank is
skipped). Every other call (`on_idle`, the flush and weight-update checks, the PD role switch) passes
through: no collective is added to an iteration without a health-check request. The all-reduce is marked in
the rank-health ledger as HEALTH_CHECK_AGREEMENT.

`process_input_requests` is fingerprinted, not replaced: it is the call site this agreement relies on, and
`abort-consensus` replaces it (two patches must not replace the same function: `base.apply` builds every
replacement from the unpatched originals, so the later one would silently drop the earlier). Not covered: PP
stages, each of which agrees within its own TP group (the PP loops are outside docs/desync-audit.md's scope).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches.impl import gloo_min as gloo_reduce

PATCH_ID = "health-check-consensus"
IS_FULLY_IDLE = "sglang.srt.managers.scheduler.Scheduler.is_fully_idle"
PROCESS_INPUT_REQUESTS = "sglang.srt.managers.scheduler.Scheduler.process_input_requests"
TARGETS = (IS_FULLY_IDLE, PROCESS_INPUT_REQUESTS)

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        IS_FULLY_IDLE: "8cfe1adc12240c08",
        PROCESS_INPUT_REQUESTS: "4abf9f52a087f303",  # the call site; replaced by abort-consensus, not here
    },
}

ReduceMin = Callable[[int, Any], int]  # (this rank's vote, group) -> the MIN over the group


def agree(idle: bool, groups: Sequence[Any], reduce_min: ReduceMin) -> bool:
    """Pure given `reduce_min`: True only if every rank of every group voted idle. Reducing group by group
    (attention-TP, then attention-CP) gives every rank of the DP group the MIN over all of it."""
    vote = int(idle)
    for group in groups:
        vote = reduce_min(vote, group)
    return bool(vote)


def sharing_groups(scheduler: Any, *, dp_attention: bool, sizes: Callable[[Any], int]) -> list[Any]:
    """The CPU groups whose ranks all received the health-check request in one broadcast (see the module
    doc), without those of a single rank, which need no agreement."""
    if dp_attention:
        candidates = [scheduler.attn_tp_cpu_group, scheduler.attn_cp_cpu_group]
    else:
        candidates = [scheduler.tp_cpu_group]
    return [group for group in candidates if group is not None and sizes(group) > 1]


def gloo_min(vote: int, group: Any) -> int:
    """One MIN all-reduce of a single int over a gloo CPU group."""
    return gloo_reduce.all_min([vote], group)[0]


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The agreeing `is_fully_idle`; `get_parallel` and the group size are bound here, at install."""
    import torch.distributed as dist
    from sglang.srt.runtime_context import get_parallel

    original = originals[IS_FULLY_IDLE]

    @functools.wraps(original)
    def is_fully_idle(self: Any, for_health_check: bool = False, ignore_waiting: bool = False) -> bool:
        idle = original(self, for_health_check, ignore_waiting)
        if not for_health_check:
            return idle
        groups = sharing_groups(self, dp_attention=get_parallel().attn_dp_enabled, sizes=dist.get_world_size)
        if not groups:
            return idle
        return bool(seams.in_collective(phases.Phase.HEALTH_CHECK_AGREEMENT,
                                        lambda: agree(idle, groups, gloo_min)))

    return {IS_FULLY_IDLE: is_fully_idle}
