"""`overlap-loop-report`: record which event loop each scheduler rank runs, in the rank-health ledger.

This is the loop-reporting part of pdfleet's rank instrumentation (`pdfleet.runtime.instrument`), which the
launcher always installs: selecting the patch in a pool is accepted and changes nothing. It stays in the
catalogue because it names a fact a rollout verifies (every rank in `event_loop_normal_disagg_*` after
`--disable-overlap-schedule`), so its single target is listed and fingerprinted like any other patch's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pdfleet.runtime.instrument import loop

TARGET = "sglang.srt.managers.scheduler._dispatch_event_loop_once"

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {TARGET: "c370b56361cac94f"},
}


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    return {TARGET: loop.wrap_dispatch(originals[TARGET])}
