"""The loop dispatcher seam: attach the rank to its pod's ledger and record which event loop SGLang picked.

`sglang.srt.managers.scheduler._dispatch_event_loop_once(scheduler)` is where every scheduler rank, in every
mode, chooses one of its `event_loop_*` methods and runs it until shutdown (or until a PD role switch, after
which `dispatch_event_loop`'s supervisor calls it again). It runs once the scheduler is built, so the ranks
are known, and before the first iteration: the right moment to attach.

The loop is recorded without repeating SGLang's choice: the original dispatcher runs unchanged, given a
stand-in for the scheduler that forwards every attribute read and write, and notes the one `event_loop_*`
method the dispatcher fetches. So the record is whatever SGLang decided (pp, overlap, normal, mlx, pdmux,
or a loop added in a later release, which the ledger shows as unknown), and the loop itself runs on the real
scheduler. This costs one attribute forward per dispatch, never per iteration.
"""

from __future__ import annotations

import sys
from typing import Any

from pdfleet.runtime.health import attach, ledger, phases
from pdfleet.runtime.instrument import placement, seams

_LOOP_PREFIX = "event_loop_"


class _LoopSpy:
    """The scheduler as the dispatcher sees it: everything forwarded, loop choice recorded."""

    __slots__ = ("_scheduler", "_writer")

    def __init__(self, scheduler: Any, writer: seams.Writer) -> None:
        object.__setattr__(self, "_scheduler", scheduler)
        object.__setattr__(self, "_writer", writer)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._scheduler, name)
        if name.startswith(_LOOP_PREFIX):
            self._writer.set_loop(phases.LoopName.from_method(name))
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._scheduler, name, value)


def wrap_dispatch(original: seams.Fn) -> seams.Fn:
    """The replacement for `_dispatch_event_loop_once`: same signature, same behaviour, plus the record."""
    def _dispatch_event_loop_once(scheduler: Any) -> Any:
        writer = attach_once()
        out = original(_LoopSpy(scheduler, writer))
        # SGLang 0.5.23 stops a scheduler only through ShutdownReq (the tokenizer manager's SIGTERM drain sends
        # it; the scheduler process has no SIGTERM handler of its own), which sets `gracefully_exit` and ends
        # the loop: the one clean exit, so the slot says EXITED. Not on a role switch (the loop is dispatched
        # again), and not on an exception: `run_scheduler_process` catches it and returns normally, so an
        # atexit hook would call a crash clean; the record stays as it was and the rank reads as Dead.
        if getattr(scheduler, "gracefully_exit", False):
            seams.use(seams.UNATTACHED)
            writer.close()
        return out
    return _dispatch_event_loop_once


def attach_once() -> seams.Writer:
    """This rank's writer, attaching it on the first call. A rank that cannot attach (a ledger of another
    geometry, no /dev/shm) says so on stderr and runs uninstrumented: serving must not depend on health
    reporting, and the agent's report shows the missing rank."""
    writer = seams.current()
    if writer is not seams.UNATTACHED:
        return writer
    try:
        where = placement_from_sglang()
        writer = attach.attach_rank(slot=where.slot, rank=where.rank, slots=where.slots)
    except (OSError, ValueError, ledger.LedgerError) as e:
        print(f"pdfleet: scheduler pid cannot join the rank-health ledger {ledger.default_path()}: {e}",
              file=sys.stderr, flush=True)
        return seams.UNATTACHED
    seams.use(writer)
    return writer


def placement_from_sglang() -> placement.Placement:
    """This process's slot, from the ranks SGLang published for it (`runtime_context.get_parallel()`)."""
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    plain_dp = p.dp_size > 1 and not p.enable_dp_attention
    return placement.place(
        tp_rank=p.tp_rank, tp_size=p.tp_size, pp_rank=p.pp_rank, pp_size=p.pp_size, nnodes=p.nnodes,
        dp_replica=(p.dp_rank or 0) if plain_dp else 0, dp_replicas=p.dp_size if plain_dp else 1,
    )
