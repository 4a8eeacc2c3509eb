"""What every process of an engine does before SGLang's scheduler runs: apply the selected patches.

The launcher exports the selection (`PDFLEET_PATCHES`, comma-separated ids); `install_from_environment` runs
in each process (via sitecustomize) and applies it when SGLang's scheduler module is imported. A process that
cannot apply its patches exits with a message: an engine whose ranks run different code is worse than none.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from pdfleet.runtime.patches import base, hooks, registry

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
EXIT_PATCH_FAILED = 3


def selected_patches() -> list[str]:
    return [p for p in os.environ.get("PDFLEET_PATCHES", "").split(",") if p]


def sglang_version() -> str:
    import sglang

    return str(sglang.__version__)


def apply_selected(patch_ids: list[str]) -> list[base.Applied]:
    return base.apply(patch_ids, sglang_version(), registry.implementations(patch_ids))


def _on_scheduler_import(_: ModuleType) -> None:
    try:
        applied = apply_selected(selected_patches())
    except base.PatchError as e:
        print(f"pdfleet: this engine process cannot apply its patches: {e}", file=sys.stderr, flush=True)
        os._exit(EXIT_PATCH_FAILED)
    if applied and os.environ.get("PDFLEET_VERBOSE"):
        print(f"pdfleet: pid {os.getpid()} applied {', '.join(a.id for a in applied)}", file=sys.stderr)


def install_from_environment() -> None:
    hooks.after_import(SCHEDULER_MODULE, _on_scheduler_import)
