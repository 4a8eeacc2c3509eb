"""flush-consensus: the ranks that receive a cache flush agree when it runs, so all flush or none does.

Why. SGLang 0.5.23 answers `/flush_cache` through `SchedulerFlushWrapper` (scheduler_components/flush_wrapper.py).
The request reaches every rank of the group in the same broadcast, but each rank decides alone: `handle` flushes
at once if `is_fully_idle()` says this rank is idle, else defers with a deadline read from this rank's own
`time.monotonic()`; `check_pending`, called by `process_input_requests` on every iteration, flushes once this
rank is idle, or gives up when this rank's clock passes its deadline; and `Scheduler.flush_cache` (the immediate
path, `timeout_s` unset) checks idleness again itself. A rank that reads its clock a moment later than its peers
(a pause in its own work between the broadcast and the check) gives up while they go on waiting and flush once
idle: its radix tree, pools and grammar cache are kept while theirs are cleared. The grammar cache is where it
turns into a hang: the next request with the same grammar is a cache hit on the rank that kept it (admitted at
once) and a miss on the ranks that flushed (queued for compilation), so they enter the grammar queue's
`all_gather_object` (`GrammarManager.get_ready_grammar_requests`) and it never does.

How. Every decision the wrapper takes is agreed by one MIN all-reduce at the point where every rank of the
group takes it, over the ranks that received the request (`health_check_consensus.sharing_groups`: the TP CPU
group; with DP attention attention TP, then attention CP):
- `handle`, dispatched from the broadcast with no flush pending (a pending one is agreed, below): the ranks
  agree [idle, idle as `flush_cache` checks it]. The first answers SGLang's `is_fully_idle()` call, so all
  flush at once or all defer; the second decides `flush_cache` on the immediate path, which runs only if every
  rank would flush and otherwise answers "not flushed" on every rank, as the busy one would.
- `check_pending` with a flush pending (every rank holds it, since `handle` was agreed): the ranks agree
  [idle, the deadline has not passed]. The deadline is the leader's (the rank that is rank 0 of every group):
  only its clock is read, and its peers vote "not passed", the MIN's neutral value. Then SGLang's own body runs
  with the agreed idleness and a deadline that is passed exactly when the leader's was, so every rank flushes,
  times out or keeps waiting together. A rank that flushes is idle by its own reading too, and `is_fully_idle()`
  implies the looser check `flush_cache` makes (`ignore_waiting` only relaxes it), so no rank's flush refuses.
No collective is added to an iteration without a pending flush or a flush request. The all-reduces are marked
in the rank-health ledger as FLUSH_AGREEMENT.

The wrapper holds its scheduler's bound methods, not the scheduler (`Scheduler.init_running_status` builds it
with `flush_cache=self.flush_cache`, `is_fully_idle=self.is_fully_idle`); the patch reads the scheduler from
them, and fingerprints that constructor call, the wrapper's constructor, and `Scheduler.flush_cache` whose
idleness check the immediate path agrees. Outside this wrapper `flush_cache` is SGLang's own: the weight
updater's flush after an update runs behind each rank's own load result (docs/desync-audit.md).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches.impl import gloo_min, health_check_consensus

PATCH_ID = "flush-consensus"
_WRAPPER = "sglang.srt.managers.scheduler_components.flush_wrapper.SchedulerFlushWrapper"
HANDLE = f"{_WRAPPER}.handle"
CHECK_PENDING = f"{_WRAPPER}.check_pending"
WRAPPER_INIT = f"{_WRAPPER}.__init__"  # fingerprinted: where the callables this patch reads are stored
FLUSH_CACHE = "sglang.srt.managers.scheduler.Scheduler.flush_cache"  # fingerprinted: its idleness check
INIT_RUNNING_STATUS = "sglang.srt.managers.scheduler.Scheduler.init_running_status"  # fingerprinted: the wiring
TARGETS = (HANDLE, CHECK_PENDING, WRAPPER_INIT, FLUSH_CACHE, INIT_RUNNING_STATUS)

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        HANDLE: "2acd44a27dcb38cc",
        CHECK_PENDING: "6beac392af7ce66b",
        WRAPPER_INIT: "76d91ade7f063718",
        FLUSH_CACHE: "145fbc1e3e65e012",
        INIT_RUNNING_STATUS: "1f36a38378e0a9b9",
    },
}

ReduceMin = Callable[[Sequence[int], Any], list[int]]  # (this rank's votes, group) -> the MIN over the group


def agree(votes: Sequence[int], groups: Sequence[Any], reduce_min: ReduceMin) -> list[int]:
    """Pure given `reduce_min`: the element-wise MIN of every rank's votes over all of `groups` (reducing group
    by group, attention TP then attention CP, gives every rank of the DP group the MIN over all of it)."""
    agreed = list(votes)
    for group in groups:
        agreed = reduce_min(agreed, group)
    return agreed


def in_time_vote(*, leader: bool, deadline: float, now: Callable[[], float]) -> int:
    """This rank's vote on "the pending flush's deadline has not passed": the leader reads its clock, every
    other rank votes 1 (the MIN's neutral value), so the agreed answer is the leader's, read once."""
    return int(now() < deadline) if leader else 1


def agreed_deadline(in_time: bool) -> float:
    """A deadline that SGLang's `time.monotonic() >= deadline` check reads as the agreed answer on every rank."""
    return math.inf if in_time else -math.inf


class _Peers:
    """The scheduler behind a flush wrapper and the groups its flush decisions are agreed over."""

    def __init__(self, scheduler: Any, groups: list[Any], leader: bool) -> None:
        self.scheduler = scheduler
        self.groups = groups
        self.leader = leader

    def agree(self, votes: Sequence[int]) -> list[int]:
        return list(seams.in_collective(phases.Phase.FLUSH_AGREEMENT,
                                        lambda: agree(votes, self.groups, gloo_min.all_min)))


@contextlib.contextmanager
def _answering(wrapper: Any, **callables: Callable[[], Any]) -> Iterator[None]:
    """SGLang's body runs with the wrapper's callables answering the agreed decisions, for this call only."""
    saved = {name: getattr(wrapper, name) for name in callables}
    for name, fn in callables.items():
        setattr(wrapper, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(wrapper, name, fn)


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    import torch.distributed as dist
    from sglang.srt.runtime_context import get_parallel

    original_handle = originals[HANDLE]
    original_check = originals[CHECK_PENDING]

    def peers(wrapper: Any) -> _Peers | None:
        """None when this rank has no peer to agree with (a group of one)."""
        scheduler = wrapper._flush_cache.__self__  # Scheduler.flush_cache, bound (init_running_status)
        groups = health_check_consensus.sharing_groups(
            scheduler, dp_attention=get_parallel().attn_dp_enabled, sizes=dist.get_world_size)
        if not groups:
            return None
        return _Peers(scheduler, groups, leader=all(dist.get_rank(group) == 0 for group in groups))

    @functools.wraps(original_handle)
    def handle(self: Any, recv_req: Any) -> Any:
        group = None if self._pending is not None else peers(self)
        if group is None:  # a flush already pending answers "in progress" on every rank (it is agreed)
            return original_handle(self, recv_req)
        scheduler = group.scheduler
        # flush_cache's own check (the immediate path calls it directly): idle, ignoring waiting requests that
        # hold no KV when the engine is paused.
        flushable = scheduler.is_fully_idle(ignore_waiting=scheduler._engine_paused)
        idle, every_flushable = group.agree([int(self._is_fully_idle()), int(flushable)])
        flush = self._flush_cache

        def agreed_flush() -> bool:
            return bool(flush()) if every_flushable else False

        with _answering(self, _is_fully_idle=lambda: bool(idle), _flush_cache=agreed_flush):
            return original_handle(self, recv_req)

    @functools.wraps(original_check)
    def check_pending(self: Any) -> None:
        group = None if self._pending is None else peers(self)
        if group is None:
            return original_check(self)
        pending_req, deadline = self._pending
        idle, in_time = group.agree([int(self._is_fully_idle()),
                                     in_time_vote(leader=group.leader, deadline=deadline, now=time.monotonic)])
        self._pending = (pending_req, agreed_deadline(bool(in_time)))
        with _answering(self, _is_fully_idle=lambda: bool(idle)):
            original_check(self)
        if self._pending is not None:  # still waiting: keep this rank's own deadline (only the leader's is read)
            self._pending = (pending_req, deadline)

    return {HANDLE: handle, CHECK_PENDING: check_pending}
