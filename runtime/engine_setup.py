"""What every process of an engine does before SGLang's scheduler runs: apply the selected patches and the
rank-health instrumentation.

The launcher exports the selection (`PDFLEET_PATCHES`, comma-separated ids); `install_from_environment` runs
in each process (via sitecustomize) and applies it when SGLang's scheduler module is imported. A process that
cannot apply its patches exits with a message: an engine whose ranks run different code is worse than none.
A patch whose implementation names `APPLY_AFTER_IMPORT_OF` waits for that module instead: the detokenizer's
module, say, is still half-imported when its own imports finish importing the scheduler, so its class is not
there yet to patch.

The instrumentation (`pdfleet.runtime.instrument`) is applied in every engine, selected or not: the operator
judges rank health from it. Its loop report is the catalogue's `overlap-loop-report` patch, so that id is
always part of the applied set; its other seams follow the catalogue patches, which they may wrap.

A process that imports SGLang's HTTP server (a tokenizer worker re-imports the app) installs pdfleet's refused
routes there (`pdfleet.runtime.refused_routes`), as the launcher does in its own process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType

from pdfleet.runtime import refused_routes, server_info_redaction
from pdfleet.runtime.instrument import apply as instrument
from pdfleet.runtime.patches import base, hooks, registry

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
EXIT_PATCH_FAILED = 3
ALWAYS_APPLIED = ("overlap-loop-report",)  # the instrumentation's loop report, see the module docstring


def selected_patches() -> list[str]:
    return [p for p in os.environ.get("PDFLEET_PATCHES", "").split(",") if p]


def sglang_version() -> str:
    import sglang

    return str(sglang.__version__)


def with_instrumentation(patch_ids: list[str]) -> list[str]:
    """The selection plus the always-applied ids, each once, in order."""
    return list(dict.fromkeys([*patch_ids, *ALWAYS_APPLIED]))


def apply_selected(patch_ids: list[str]) -> list[base.Applied]:
    """Applies the selected catalogue patches (with `ALWAYS_APPLIED`), then the instrumentation's seams.
    Raises `base.PatchError` on any problem; the callers then start nothing (launcher) or exit (a rank)."""
    version = sglang_version()
    ids = with_instrumentation(patch_ids)
    applied = base.apply(ids, version, registry.implementations(ids))
    applied.append(instrument.install(version))
    return applied


def deferred(patch_ids: list[str]) -> dict[str, list[str]]:
    """The selected patches applied after a module other than the scheduler's, by that module."""
    later: dict[str, list[str]] = {}
    for pid, impl in registry.implementations(patch_ids).items():
        module = getattr(impl, "APPLY_AFTER_IMPORT_OF", None)
        if module is not None and module != SCHEDULER_MODULE:
            later.setdefault(module, []).append(pid)
    return later


def _applying(apply: Callable[[], list[base.Applied]]) -> Callable[[ModuleType], None]:
    def on_import(_: ModuleType) -> None:
        try:
            applied = apply()
        except base.PatchError as e:
            print(f"pdfleet: this engine process cannot apply its patches: {e}", file=sys.stderr, flush=True)
            os._exit(EXIT_PATCH_FAILED)
        if applied and os.environ.get("PDFLEET_VERBOSE"):
            print(f"pdfleet: pid {os.getpid()} applied {', '.join(a.id for a in applied)}", file=sys.stderr)

    return on_import


def install_from_environment() -> None:
    selected = selected_patches()
    later = deferred(selected)
    now = [pid for pid in selected if not any(pid in ids for ids in later.values())]
    hooks.after_import(SCHEDULER_MODULE, _applying(lambda: apply_selected(now)))
    for module, ids in later.items():
        hooks.after_import(module, _applying(
            lambda ids=ids: base.apply(ids, sglang_version(), registry.implementations(ids))))
    hooks.after_import(refused_routes.MODULE, _applying(lambda: [refused_routes.install(sglang_version()),
                                                                 server_info_redaction.install(sglang_version())]))
