"""SGLang's own prefill admission in the prefill reproduction: one rank's KV pool has less free memory.

With a scenario's `kv_free`, `tests.repro.prefill` builds each rank's scheduler with this module: admission is
SGLang 0.5.23's own `Scheduler.get_new_batch_prefill` / `_get_new_batch_prefill_raw`, with its `PrefillAdder`,
`PrefillBudget`, `SchedulePolicy`, `get_num_allocatable_reqs` and `Req.init_next_round_input`, over a real
`RadixCache`, a `PagedTokenToKVPoolAllocator` (page size 1) whose free pages are a CPU tensor and a `ReqToTokenPool`
whose free slots are a list; the requests are SGLang's `Req` (`PROMPT` prompt tokens, `MAX_NEW` new tokens).

Stand-ins, and why: the batch SGLang builds from the admitted requests (`ScheduleBatch.init_new`,
`prepare_for_extend`) writes device tensors for the forward; here its `prepare_for_extend` takes the admitted
prompts' pages and a request slot from the pools, which is all admission reads afterwards. The tree cache answers
`supports_mamba()` True so that SGLang's release path frees a request that never held a KV row (the forward that
would have bound one does not run); no Mamba pool exists, so nothing else reads it.
"""

from __future__ import annotations

from array import array
from typing import Any

PROMPT = 300  # prompt tokens of every request
MAX_NEW = 128  # its max_new_tokens: PrefillAdder reserves them, clipped, in its budget
SLOTS = 64  # free request slots of every rank


def real_request(rid: str, fields: dict[str, Any]) -> Any:
    """SGLang's `Req` for `rid`, given the fields the prefill queues and failure paths read that `Req` does not
    have (`fields`: those of tests.repro.prefill's request); its own attributes stay SGLang's."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=MAX_NEW)
    params.normalize(None)
    req = Req(rid, "", array("q", [sum(map(ord, rid)) % 1000] * PROMPT), params)
    for name, value in fields.items():
        if name in ("disagg_kv_sender", "pending_bootstrap", "metadata_buffer_index") or not hasattr(req, name):
            setattr(req, name, value)
    for name, value in vars(fields["time_stats"]).items():
        if not hasattr(req.time_stats, name):
            setattr(req.time_stats, name, value)
    return req


class _Batch:
    """What the prefill loop reads of the batch SGLang built: its requests and chunked request."""

    def __init__(self, reqs: list[Any], chunked_req: Any, pools: tuple[Any, Any]) -> None:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        self.reqs = reqs
        self.chunked_req = chunked_req
        self.forward_mode = ForwardMode.EXTEND
        self.prefill_chunk_processed = False
        self._pools = pools

    def prepare_for_extend(self) -> None:  # SGLang's allocates these pages and slots, then writes the forward's inputs
        allocator, slots = self._pools
        for req in self.reqs:
            allocator.free_pages = allocator.free_pages[len(req.full_untruncated_fill_ids) - req.prefix_len:]
            slots.free_slots.pop()

    def batch_size(self) -> int:
        return len(self.reqs)

    def filter_batch(self, reqs_to_exclude: list[Any]) -> None:
        self.reqs = [req for req in self.reqs if req not in reqs_to_exclude]


def running_batch() -> Any:
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    return ScheduleBatch(reqs=[], batch_is_full=False)


def equip(scheduler: Any, kv_free: int) -> None:
    """Give `scheduler` SGLang's own admission over pools with `kv_free` free KV tokens."""
    import torch
    from sglang.srt.managers import scheduler as scheduler_module
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(pp_max_micro_batch_size=SLOTS)
    allocator = object.__new__(PagedTokenToKVPoolAllocator)
    vars(allocator).update(page_size=1, device="cpu", num_staged_pages=0,
                           free_pages=torch.arange(1, kv_free + 1, dtype=torch.int64))
    slots = object.__new__(ReqToTokenPool)
    slots.free_slots = list(range(1, SLOTS + 1))
    tree_cache = RadixCache.create_simulated(mock_allocator=allocator)
    tree_cache.supports_mamba = lambda: True  # the release path of a request that never held a KV row
    del scheduler.get_new_batch_prefill  # SGLang's own from here on
    vars(scheduler).update(
        tree_cache=tree_cache, token_to_kv_pool_allocator=allocator, req_to_token_pool=slots, page_size=1,
        policy=SchedulePolicy("fcfs", tree_cache, False, False, False), chunked_req=None, waiting_queue=[],
        grammar_manager=_NoGrammars(), enable_priority_preemption=False, is_hybrid_swa=False,
        min_free_slots_delayer=None, prefill_delayer=None, dynamic_chunk_sizer=None, chunked_prefill_size=8192,
        max_prefill_tokens=16384, is_mixed_chunk=False, priority_scheduling_preemption_threshold=10,
        max_prefill_bs=0, max_running_requests=SLOTS, dllm_config=None, enable_lora=False,
        enable_hicache_storage=False, enable_lmcache=False, truncation_align_size=None,
        enable_hierarchical_cache=False, enable_unified_cache_external_linker=False, hisparse_coordinator=None,
        enable_priority_scheduling=False, device="cpu", model_config=None, spec_algorithm=None,
        new_token_ratio_tracker=_Ratio(), beam_coordinator=_NoBeams(),
        tp_worker=_Worker(), load_inquirer=_NoPending(),
    )
    pools = (allocator, slots)

    class Batches(scheduler_module.ScheduleBatch):  # type: ignore[misc]
        @classmethod
        def init_new(cls, reqs: list[Any], *_: Any, chunked_req: Any = None, **__: Any) -> Any:
            return _Batch(reqs, chunked_req, pools)

    scheduler_module.ScheduleBatch = Batches
    scheduler_module.PrefillStats = _NoStats


class _NoGrammars:
    def has_waiting_grammars(self) -> bool:
        return False


class _Ratio:
    current = 0.7  # SGLang's initial new-token ratio (`--schedule-conservativeness 1`)


class _NoBeams:
    def pending_member_rows(self, _: Any) -> int:
        return 0

    def retire_group(self, *_: Any) -> None:
        return None


class _Worker:
    model_runner = type("ModelRunner", (), {"attn_backend": object(), "prefill_aware_swa": False})()


class _NoPending:
    def _get_num_pending_tokens(self, **_: Any) -> int:
        return 0


class _NoStats:
    @staticmethod
    def from_adder(*_: Any, **__: Any) -> None:  # metrics for the log line after the forward
        return None
