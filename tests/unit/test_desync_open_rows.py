"""The mechanism behind rows of docs/desync-audit.md's "Reachable collectives", shown on SGLang 0.5.23's own code.

- The multimodal `broadcast_object_list` (`Scheduler._process_and_broadcast_mm_inputs`): `_handle_generate_request`
  returns early for a session the rank's `SessionController` no longer holds, and each rank reaps timed-out
  sessions on its own clock (`maybe_reap`'s interval, `Session.is_timed_out`, `last_active_time`). Two ranks that
  opened the same session from the same broadcast, reading their clocks a millisecond apart, disagree about it.
  Fixed by `abort-consensus` (reproduced and checked patched in tests/unit/test_session_reap_consensus.py).
- HiCache's all-reduce (`UnifiedRadixCache._all_reduce_attn_groups`), its three named entries settled lockstep
  without PP: the `is_terminated()` flag `check_prefetch_progress` branches on is set off the scheduler thread
  only by the PP ticket thread; what `prefetch_rate_limited()` reads (in front of `query_storage_hit_length`)
  changes off the scheduler thread only on the PP ticket path; `ready_to_load_host_cache` is called from the
  decode load-back step whatever each rank's CUDA events say (shown on SGLang's own step), and their READY
  enters only the MIN-reduced transfer poll. Shown on SGLang's installed source; PP is refused by pdfleet.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from tests.support import requires

OPENED_AT = 100.0  # the first rank's clock when it opened the session; its peer read 1 ms later
TIMEOUT_S = 5.0


def test_two_ranks_reap_the_same_session_at_different_iterations_on_their_own_clocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    requires.installed("sglang")
    from sglang.srt.managers.io_struct import OpenSessionReqInput
    from sglang.srt.session import session_controller as module

    clock = [OPENED_AT]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])  # this process's clock, set by the test
    ranks = []
    for skew in (0.0, 0.001):  # each rank handles the broadcast OpenSessionReqInput at its own moment
        clock[0] = OPENED_AT + skew
        # The radix cache is told of a session's release (both its calls); none is built here.
        controller = module.SessionController(tree_cache=SimpleNamespace(
            release_radix_session=lambda sid: None, release_session=lambda sid: None))
        controller._last_reap_time = clock[0]
        assert controller.open(OpenSessionReqInput(capacity_of_str_len=64, session_id="s", timeout=TIMEOUT_S)).success
        ranks.append(controller)

    # An iteration after the timeout, as process_input_requests reaps: `now` read by each rank after the same
    # broadcast, here at the same moment, half a millisecond past the first rank's deadline and before its peer's.
    held = []
    clock[0] = OPENED_AT + TIMEOUT_S + 0.0005
    for controller in ranks:
        controller.maybe_reap(clock[0])
        held.append("s" in controller)
    assert held == [False, True], "the first rank reaped the session, its peer still holds it"


# --- HiCache (`UnifiedRadixCache._all_reduce_attn_groups`): what a prefetch's `is_terminated()` depends on ---

def _srt_root() -> pathlib.Path:
    import sglang

    return pathlib.Path(sglang.__file__).parent / "srt"


def _enclosing_functions(tree: ast.Module, wanted: Callable[[ast.AST], bool]) -> set[str]:
    """Qualified names (Class.method) of the functions holding a node `wanted` accepts."""
    found: set[str] = set()

    def walk(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = (*scope, child.name)
            if wanted(child):
                found.add(".".join(scope))
            walk(child, inner)

    walk(tree, ())
    return found


def test_a_prefetch_is_marked_terminated_off_the_scheduler_thread_only_by_the_pp_ticket_thread() -> None:
    """check_prefetch_progress branches on `operation.is_terminated()` before `_can_terminate_prefetch`'s
    all-reduce (timeout policy). Were the flag set by a background thread, ranks would read it at different
    moments and one would skip the all-reduce. In 0.5.23 only two functions set it: `terminate_prefetch`, which
    the scheduler thread calls (check_prefetch_progress, abort release, storage detach) after the decision, and
    the PP ticket thread, started only with a PP group of more than one stage. pdfleet refuses PP at admission,
    so on the PD paths it runs the flag changes only on the scheduler thread, at the same step on every rank."""
    requires.installed("sglang")
    from pdfleet.operator.api.flags import reserved_flag

    srt = _srt_root()
    setters: set[str] = set()
    callers: set[str] = set()
    thread_starts: dict[str, set[str]] = {}
    for path in srt.rglob("*.py"):
        text = path.read_text()
        if "terminate" not in text and "pp_prefetch_command" not in text:
            continue
        tree = ast.parse(text)
        module = ".".join(path.relative_to(srt).with_suffix("").parts)
        setters |= {f"{module}:{fn}" for fn in _enclosing_functions(tree, lambda n: (
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "mark_terminate"))}
        callers |= {f"{module}:{fn}" for fn in _enclosing_functions(tree, lambda n: (
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "terminate_prefetch"))}
        for fn in _enclosing_functions(tree, lambda n: (
                isinstance(n, ast.Call) and any(k.arg == "target" and isinstance(k.value, ast.Attribute)
                                                and k.value.attr == "pp_prefetch_command_thread_func"
                                                for k in n.keywords))):
            thread_starts.setdefault(module, set()).add(fn)
    assert setters == {
        "managers.cache_controller:HiCacheController.terminate_prefetch",
        "mem_cache.hybrid_cache.hybrid_cache_controller:HybridCacheController.pp_prefetch_command_thread_func",
    }, f"a new place marks a prefetch terminated; is it on the scheduler thread? {sorted(setters)}"
    # terminate_prefetch's callers are scheduler-thread steps, none a thread target (the controllers' threads run
    # prefetch_thread_func, prefetch_io_aux_func, prefetch_sync_thread_func, backup_thread_func and the PP one).
    assert callers == {
        "mem_cache.unified_radix_cache:UnifiedRadixCache.check_prefetch_progress",
        "mem_cache.unified_radix_cache:UnifiedRadixCache.release_aborted_request",
        "mem_cache.unified_cache.storage_attachment:StorageAttachment._release_pending_storage_ops",
    }, sorted(callers)
    # The PP ticket thread starts only once its command group exists, which is created only for more than one
    # PP stage.
    hybrid_path = srt / "mem_cache" / "hybrid_cache" / "hybrid_cache_controller.py"
    hybrid = hybrid_path.read_text()
    assert thread_starts == {"mem_cache.hybrid_cache.hybrid_cache_controller": {
        "HybridCacheController._start_storage_threads", "HybridCacheController.reset"}}
    assert hybrid.count("self.pp_prefetch_command_group = create_custom_parallel_group(") == 1
    creation = hybrid[:hybrid.index("self.pp_prefetch_command_group = create_custom_parallel_group(")]
    assert "torch.distributed.get_world_size(group=self.pp_group) > 1" in creation[-1500:]
    assert "if self.pp_prefetch_command_group is not None:" in hybrid
    # ... and pdfleet runs no PP stage: --pp-size is refused at admission.
    assert reserved_flag("--pp-size") and reserved_flag("--pipeline-parallel-size")


# --- HiCache: `query_storage_hit_length` behind `prefetch_rate_limited()` ---

_CONTROLLERS = ("managers/cache_controller.py", "mem_cache/hybrid_cache/hybrid_cache_controller.py")
_CONTROLLER_CLASSES = ("HiCacheController", "HybridCacheController")


def _self_calls(fn: ast.AST) -> set[str]:
    return {n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"}


def _writes_occupied(node: ast.AST) -> bool:
    if isinstance(node, ast.AugAssign):
        return "prefetch_tokens_occupied" in ast.unparse(node.target)
    return isinstance(node, ast.Assign) and any("prefetch_tokens_occupied" in ast.unparse(t) for t in node.targets)


def test_prefetch_rate_limited_reads_only_state_the_storage_threads_leave_alone_off_pp() -> None:
    """query_storage_hit_length (decode `pop_preallocated` through the HiCache mixin, and prefill admission)
    returns before its MIN all-reduce when `prefetch_rate_limited()` holds. That answer is read per rank, so it
    is lockstep only if what it reads changes at the same scheduler step on every rank. It reads
    `prefetch_tokens_occupied` (cache mode, and buffer mode on the hybrid shared arena) or the host pool's use
    less the staged writes (buffer mode). In 0.5.23 `prefetch_tokens_occupied` is written only by scheduler-thread
    functions (admission's `prefetch_from_storage`, the MIN-counted ack drain, `check_prefetch_progress`, abort
    release, the buffer pipeline's steps, reset/attach) and by PP-only code; the controllers' storage threads
    (prefetch, I/O, ack sync, backup) neither write it nor allocate or free host memory, except on the PP ticket
    path (refused by pdfleet). The other conditions in front (`enable_storage`, the prefetch threshold against
    the request's page-aligned suffix) are configuration and the request's tokens."""
    requires.installed("sglang")
    from pdfleet.operator.api.flags import reserved_flag

    srt = _srt_root()
    # What prefetch_rate_limited reads: a new input (a storage thread's progress, a clock) fails here.
    reads: set[str] = set()
    for rel in _CONTROLLERS:
        for cls in ast.parse((srt / rel).read_text()).body:
            if isinstance(cls, ast.ClassDef) and cls.name in _CONTROLLER_CLASSES:
                for fn in cls.body:
                    if isinstance(fn, ast.FunctionDef) and fn.name == "prefetch_rate_limited":
                        reads |= {ast.unparse(n) for n in ast.walk(fn) if isinstance(n, ast.Attribute)
                                  and isinstance(n.value, ast.Name) and n.value.id == "self"}
    assert reads == {"self.host_memory_mode", "self.host_write_staged_tokens_fn", "self.mem_pool_host",
                     "self.prefetch_capacity_limit", "self.prefetch_tokens_occupied"}, sorted(reads)

    # Every writer of prefetch_tokens_occupied.
    writers: set[str] = set()
    for path in srt.rglob("*.py"):
        text = path.read_text()
        if "prefetch_tokens_occupied" not in text:
            continue
        module = ".".join(path.relative_to(srt).with_suffix("").parts)
        writers |= {f"{module}:{fn}" for fn in _enclosing_functions(ast.parse(text), _writes_occupied)}
    assert writers == {
        "managers.cache_controller:HiCacheController.attach_storage_backend",
        "managers.cache_controller:HiCacheController.reset",
        "mem_cache.hybrid_cache.hybrid_cache_controller:HybridCacheController.reset",
        "mem_cache.unified_radix_cache:UnifiedRadixCache.prefetch_from_storage",
        "mem_cache.unified_radix_cache:UnifiedRadixCache._handle_prefetch_result",
        "mem_cache.unified_radix_cache:UnifiedRadixCache._retire_ongoing_prefetch",
        "mem_cache.buffer_mode.pipeline:BufferModePipeline._queue_prefetch",
        "mem_cache.buffer_mode.pipeline:BufferModePipeline.stage_completed_prefetch",
        "mem_cache.buffer_mode.pipeline:BufferModePipeline.try_finish_load_back",
        "mem_cache.buffer_mode.pipeline:BufferModePipeline.release_staged_hold",
        # PP only: the ticket thread and what it and the ack sync's PP branch free.
        "mem_cache.hybrid_cache.hybrid_cache_controller:HybridCacheController._allocate_pp_prefetch_buffers",
        "mem_cache.hybrid_cache.hybrid_cache_controller:HybridCacheController._free_pp_prefetch_state",
        "mem_cache.hybrid_cache.hybrid_cache_controller:HybridCacheController.pp_prefetch_command_thread_func",
    }, f"a new writer of prefetch_tokens_occupied; which thread runs it? {sorted(writers)}"

    # The controllers' threads, and every controller method they reach through self: which of them touch the
    # counter or the host pool's allocation.
    methods: dict[str, list[ast.FunctionDef]] = {}
    targets: set[str] = set()
    for rel in _CONTROLLERS:
        tree = ast.parse((srt / rel).read_text())
        for cls in tree.body:
            if isinstance(cls, ast.ClassDef) and cls.name in _CONTROLLER_CLASSES:
                for fn in cls.body:
                    if isinstance(fn, ast.FunctionDef):
                        methods.setdefault(fn.name, []).append(fn)
        targets |= {k.value.attr for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords
                    if k.arg == "target" and isinstance(k.value, ast.Attribute)
                    and isinstance(k.value.value, ast.Name) and k.value.value.id == "self"}
    assert targets == {"prefetch_thread_func", "prefetch_io_aux_func", "prefetch_sync_thread_func",
                       "backup_thread_func", "pp_prefetch_command_thread_func"}, sorted(targets)
    touching: dict[str, set[str]] = {}
    for target in targets:
        seen: set[str] = set()
        stack = [target]
        while stack:
            name = stack.pop()
            if name in seen or name not in methods:
                continue
            seen.add(name)
            for fn in methods[name]:
                stack.extend(_self_calls(fn))
                if any(_writes_occupied(n) or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                               and ast.unparse(n.func) in ("self.mem_pool_host.alloc",
                                                                           "self.mem_pool_host.free"))
                       for n in ast.walk(fn)):
                    touching.setdefault(target, set()).add(name)
    assert touching == {
        "pp_prefetch_command_thread_func": {"pp_prefetch_command_thread_func", "_allocate_pp_prefetch_buffers"},
        "prefetch_sync_thread_func": {"_free_pp_prefetch_state"},
    }, touching
    # The ack sync thread frees PP state only for an operation marked `is_pp_broadcast`, which only the PP
    # ticket path marks: HybridCacheController.submit_prefetch past its "no PP command group" return, and the
    # ticket thread. The group exists only for more than one PP stage (the test above).
    hybrid = (srt / _CONTROLLERS[1]).read_text()
    sync = next(ast.get_source_segment(hybrid, fn) or "" for fn in ast.walk(ast.parse(hybrid))
                if isinstance(fn, ast.FunctionDef) and fn.name == "prefetch_sync_thread_func")
    assert sync.index('if not getattr(ack.operation, "is_pp_broadcast", False):') < sync.index(
        "self._free_pp_prefetch_state(state)")
    markers = _enclosing_functions(ast.parse(hybrid), lambda n: isinstance(n, ast.Assign) and any(
        ast.unparse(t) == "operation.is_pp_broadcast" for t in n.targets))
    assert markers == {"HybridCacheController.submit_prefetch", "HybridCacheController.pp_prefetch_command_thread_func"}
    submit = hybrid[hybrid.index("    def submit_prefetch("):]
    assert submit.index("if self.pp_prefetch_command_group is None:") < submit.index(
        "operation.is_pp_broadcast = True")
    assert reserved_flag("--pp-size") and reserved_flag("--pipeline-parallel-size")


# --- HiCache: `ready_to_load_host_cache` and the decode load-back's READY ---

def _decode_load_back_rank(lag: int) -> tuple[SimpleNamespace, list[int], list[int]]:
    """One decode rank's HiCache as SGLang's load-back step sees it: the load-back slot is free on every rank
    (SGLang reaps acks with a MIN), and the CUDA event of a copy started at iteration i completes at i + lag
    on this rank. Returns the queue's `self`, the iteration counter and the iterations that started a copy."""
    iteration = [0]
    started: list[int] = []
    counter = SimpleNamespace(producer_index=-1)

    def ready_to_load_host_cache() -> int:  # the collective entry (Mooncake's MLA all_gather_object)
        counter.producer_index += 1
        started.append(iteration[0])
        return counter.producer_index

    tree_cache = SimpleNamespace(
        is_load_back_event_done=lambda index: iteration[0] >= started[index] + lag,
        has_free_load_back_slot=lambda: True,
        ready_to_load_host_cache=ready_to_load_host_cache,
        cache_controller=SimpleNamespace(layer_done_counter=counter))
    return SimpleNamespace(tree_cache=tree_cache), iteration, started


def test_the_decode_load_back_starts_copies_in_step_whatever_each_ranks_cuda_events_say() -> None:
    """The decode transfer queue's load-back step marks a request READY from `is_load_back_event_done`, this
    rank's own CUDA event, so READY differs across ranks for an iteration. It calls `ready_to_load_host_cache`
    (which with Mooncake's MLA dedup linker enters an all_gather_object on every call) only for requests still
    PENDING with no copy yet, and READY is only ever set on a request that has one: the local event decides no
    call. READY reaches a collective only as a value: the gated receiver answers Transferring until it, and the
    decode transfer poll MIN-reduces every rank's answer (kv-poll-lockstep's row), so no rank commits early."""
    requires.installed("sglang")
    import inspect

    from sglang.srt.disaggregation import decode as decode_module
    from sglang.srt.disaggregation import utils as disagg_utils
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.decode_hicache_mixin import (
        DecodeHiCacheTransferMixin,
        HiCacheRestoreGatedKVReceiver,
        HiCacheRestoreResult,
    )

    arrivals = {1: ["r1"], 2: ["r2"], 3: []}  # a request reaches the transfer queue at the same step on every rank
    ranks = {lag: _decode_load_back_rank(lag) for lag in (0, 1)}
    queues: dict[int, list[SimpleNamespace]] = {lag: [] for lag in ranks}
    statuses: dict[int, list[dict[str, str]]] = {lag: [] for lag in ranks}
    for step, new in arrivals.items():
        for lag, (queue_self, iteration, _) in ranks.items():
            iteration[0] = step
            queues[lag] += [SimpleNamespace(rid=rid, prefix_match=None, hicache_load_consumer_index=-1,
                                            hicache_restore_status=HiCacheRestoreResult.PENDING) for rid in new]
            DecodeHiCacheTransferMixin._process_hicache_local_restores(queue_self, queues[lag])
            statuses[lag].append({dr.rid: dr.hicache_restore_status.value for dr in queues[lag]})
    assert ranks[0][2] == ranks[1][2] == [1, 2], "a copy (and its collective) starts at the same steps"
    assert statuses[0][0] == {"r1": "ready"} and statuses[1][0] == {"r1": "pending"}, \
        "READY is this rank's event: the ranks disagree for an iteration"
    assert statuses[0][-1] == statuses[1][-1] == {"r1": "ready", "r2": "ready"}

    # Where READY goes: the gated receiver's poll, which the transfer queue MIN-reduces across ranks.
    transferred = SimpleNamespace(poll=lambda: KVPoll.Success)
    polls = [HiCacheRestoreGatedKVReceiver(SimpleNamespace(kv_receiver=transferred, hicache_restore_status=s)).poll()
             for s in (HiCacheRestoreResult.READY, HiCacheRestoreResult.PENDING)]
    assert polls == [KVPoll.Success, KVPoll.Transferring] and min(polls) == KVPoll.Transferring
    assert "op=dist.ReduceOp.MIN" in inspect.getsource(disagg_utils._all_reduce_polls)
    pollers = inspect.getsource(decode_module.DecodeTransferQueue._pollers)
    assert "HiCacheRestoreGatedKVReceiver(dr) for dr in self.queue" in pollers
