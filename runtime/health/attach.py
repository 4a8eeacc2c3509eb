"""The one call a scheduler rank makes to join its pod's ledger."""

from __future__ import annotations

import os
from pathlib import Path

from pdfleet.runtime.health import ledger, stacks, writer


def attach_rank(
    *,
    slot: int,
    rank: int,
    slots: int,
    path: str | os.PathLike[str] | None = None,
    stack_signal: int | None = stacks.DEFAULT_SIGNAL,
) -> writer.RankWriter:
    """Open (or create) the pod's ledger at `path` (default: `ledger.default_path()`), claim `slot` for
    this process as `rank`, and make the rank's stacks capturable on `stack_signal` (None: not at all;
    choose a signal the engine does not use itself). Call once per rank process, from the thread that
    runs the event loop, before the loop starts; the slot reads STARTING until the first phase."""
    where = Path(path) if path is not None else ledger.default_path()
    led = ledger.Ledger.open(where, slots)
    w = led.writer(slot, rank=rank)
    if stack_signal is not None:
        dump_file = stacks.install_dumper(stacks.stack_path(where, slot), stack_signal)
        _keep_open.append(dump_file)
        w.set_stack_signal(stack_signal)
    return w


# The dump files must stay open as long as the process lives: faulthandler writes to their descriptors.
_keep_open: list[object] = []
