"""Which functions of SGLang's scheduler modules enter a collective, found by reading their source.

tests/unit/test_desync_audit.py holds the result against docs/desync-audit.md: every function found here must be
audited there (`desync_audit.AUDITED`) or named with the reason it has no row (`desync_audit.UNLISTED`), so a
collective the PD loops can reach cannot be missed by the audit's reader. The scan is syntactic: a call whose name
is one of `COLLECTIVE_CALLS`, made anywhere in the function's body (nested helpers included).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

# torch.distributed's collectives and SGLang's wrappers that enter one.
COLLECTIVE_CALLS = frozenset({
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_gather_single", "barrier",
    "broadcast", "broadcast_pyobj", "attn_cp_tp_broadcast_pyobj", "gather", "reduce_scatter", "point_to_point_pyobj",
    "all_reduce_flags", "poll_and_all_reduce", "poll_and_all_reduce_attn_cp_tp_group",
    "poll_and_all_reduce_with_staging",
})

# The modules whose functions a PD scheduler rank runs in its loops (relative to the `sglang` package; a folder
# stands for every module in it). Left out, as out of the audit's scope: the PP mixin, HiCache's controller and
# host-side helpers, the unified radix cache, the KV pools' forward-time code, the model forward.
SCANNED_MODULES = (
    "srt/managers/scheduler.py",
    "srt/managers/scheduler_components/",
    "srt/managers/scheduler_input_blocker.py",
    "srt/managers/schedule_batch.py",
    "srt/managers/schedule_policy.py",
    "srt/managers/prefill_delayer.py",
    "srt/managers/hisparse_coordinator.py",
    "srt/managers/tp_worker.py",
    "srt/disaggregation/decode.py",
    "srt/disaggregation/prefill.py",
    "srt/disaggregation/utils.py",
    "srt/disaggregation/decode_kvcache_offload_manager.py",
    "srt/constrained/grammar_manager.py",
    "srt/mem_cache/common.py",
    "srt/mem_cache/prefill_budget.py",
    "srt/utils/poll_based_barrier.py",
)


def _functions(tree: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}.{node.name}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}.{node.name}", node


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return call.func.id if isinstance(call.func, ast.Name) else None


def entering_collectives(source: str, module: str) -> dict[str, set[str]]:
    """Dotted name of each function (methods as Class.method) in `source` -> the collective calls it makes."""
    found: dict[str, set[str]] = {}
    for dotted, node in _functions(ast.parse(source), module):
        calls = {name for n in ast.walk(node) if isinstance(n, ast.Call)
                 if (name := _called_name(n)) in COLLECTIVE_CALLS}
        if calls:
            found[dotted] = calls
    return found


def scanned_files(package_root: Path) -> list[Path]:
    files: list[Path] = []
    for relative in SCANNED_MODULES:
        path = package_root / relative
        files.extend(sorted(path.glob("*.py")) if relative.endswith("/") else [path])
    return files


def scan(package_root: Path) -> dict[str, set[str]]:
    """`entering_collectives` over every module of `SCANNED_MODULES` under the installed `sglang` package."""
    found: dict[str, set[str]] = {}
    for path in scanned_files(package_root):
        module = "sglang." + path.relative_to(package_root).with_suffix("").as_posix().replace("/", ".")
        found.update(entering_collectives(path.read_text(), module))
    return found
