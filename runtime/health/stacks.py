"""Python stacks of a rank on demand, including a rank blocked inside a C-level collective.

How: each rank registers `faulthandler` on a signal (SIGUSR2 by default) with a per-rank file opened for
appending, and advertises that signal in its ledger slot. To capture, the agent truncates the file, sends
the signal, and reads the file back once it has stopped growing.

Why faulthandler and not a Python signal handler: CPython runs a `signal.signal` handler only in the main
thread, between two bytecodes. A rank blocked in a gloo collective sits in C++ (`work.wait()`, a condition
variable wait that simply waits again after a signal) and never returns to the interpreter, so its Python
handlers never run, GIL released or not: a Python handler would time out exactly when the stacks matter.
(A C call that gives up on EINTR does return, and then the Python handler runs; gloo's wait does not.)
`faulthandler.register` installs a C handler that walks every thread's frames and writes them with
`write(2)` from inside the signal handler, needing neither the GIL nor the interpreter loop. It registers
with SA_RESTART (chain=False), so the interrupted system call resumes and the rank stays where it was.
`tests/unit/test_agent_stacks.py` shows this on a rank blocked in a C call that holds the GIL, and on a
rank blocked in a real gloo all-reduce, where a Python handler sent alongside never runs.

Limits: the C handler reads thread states without locks (what faulthandler always does on a crash); it
sees only threads that run Python (gloo's and NCCL's own threads have no Python frames); a process that
does not run at all (SIGSTOP, uninterruptible sleep in the kernel) does not answer, and the capture times
out. Never send the signal to a process that did not advertise it: its default action terminates it.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

DEFAULT_SIGNAL = signal.SIGUSR2
_POLL_S = 0.005
_SETTLED_S = 0.05


def stack_path(ledger_path: Path, slot: int) -> Path:
    """Where the rank in `slot` dumps its stacks: beside the ledger, so one volume holds both."""
    return ledger_path.with_name(f"{ledger_path.name}.stacks.{slot}")


def install_dumper(path: Path, signum: int = DEFAULT_SIGNAL) -> BinaryIO:
    """Rank side: dump all threads' stacks to `path` whenever `signum` arrives. Returns the open file,
    which must stay open for the life of the process (faulthandler writes to its descriptor). Opened for
    appending, so a dump lands at the start of the file after the agent truncates it."""
    f = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signum, file=f, all_threads=True, chain=False)
    return f


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """A process to capture: its pid, the signal it advertised, and where it dumps."""

    pid: int
    signum: int
    path: Path


@dataclasses.dataclass(frozen=True, slots=True)
class Capture:
    """The stacks of one process, or why there are none."""

    target: Target
    text: str | None
    error: str | None = None


def capture(targets: Sequence[Target], *, timeout_s: float) -> list[Capture]:
    """Signal every target at once, then wait (at most `timeout_s` in all) for each dump to appear and
    stop growing. Callers must serialize captures of the same files."""
    sent: list[Target] = []
    results: dict[Target, Capture] = {}
    for t in targets:
        try:
            os.truncate(t.path, 0)
            os.kill(t.pid, t.signum)
        except OSError as e:
            results[t] = Capture(t, None, f"could not signal pid {t.pid}: {e.strerror or e}")
        else:
            sent.append(t)

    deadline = time.monotonic() + timeout_s
    sizes = {t: (-1, 0.0) for t in sent}  # last size seen, and since when
    while sizes:
        now = time.monotonic()
        for t in list(sizes):
            size = _size(t.path)
            last, since = sizes[t]
            if size != last:
                sizes[t] = (size, now)
            elif size > 0 and now - since >= _SETTLED_S:
                results[t] = Capture(t, t.path.read_bytes().decode("utf-8", "replace"))
                del sizes[t]
                continue
            if now >= deadline:
                results[t] = Capture(t, None, f"no stacks from pid {t.pid} within {timeout_s:g}s")
                del sizes[t]
        if sizes:
            time.sleep(_POLL_S)
    return [results[t] for t in targets]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
