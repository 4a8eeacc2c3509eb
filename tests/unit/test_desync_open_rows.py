"""The mechanism behind rows of docs/desync-audit.md's "Reachable collectives", shown on SGLang 0.5.23's own code.

- The multimodal `broadcast_object_list` (`Scheduler._process_and_broadcast_mm_inputs`): `_handle_generate_request`
  returns early for a session the rank's `SessionController` no longer holds, and each rank reaps timed-out
  sessions on its own clock (`maybe_reap`'s interval, `Session.is_timed_out`, `last_active_time`). Two ranks that
  opened the same session from the same broadcast, reading their clocks a millisecond apart, disagree about it.
  Fixed by `abort-consensus` (reproduced and checked patched in tests/unit/test_session_reap_consensus.py).
- HiCache's all-reduce (`UnifiedRadixCache._all_reduce_attn_groups`), one of its entries settled: the
  `is_terminated()` flag `check_prefetch_progress` branches on is set off the scheduler thread only by the PP
  ticket thread (PP refused by pdfleet), shown on SGLang's source. The row's other entries stay open.
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
