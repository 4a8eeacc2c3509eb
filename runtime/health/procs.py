"""Process identity: is the process that wrote a slot still alive under its pid.

A pid alone is not an identity: after a rank dies its pid can be reused, and a zombie (dead, not yet
reaped by its parent) still answers `kill(pid, 0)`. So a writer records its start time as well (field 22
of /proc/<pid>/stat, in clock ticks since boot), and a reader checks both, and the process state, in
/proc. Where /proc is missing (not Linux) the start time is 0 and liveness falls back to `kill(pid, 0)`.

The reader must see the writers' pids: run the agent in the engine's container, or share the pod's
process namespace.
"""

from __future__ import annotations

import os

_PROC = "/proc"


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may contain spaces and parentheses),
    so that index 0 is field 3 (state) and index 19 is field 22 (starttime); None when unreadable."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int:
    """The process start time in clock ticks since boot, or 0 when it cannot be read."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else 0


def is_alive(pid: int, expected_start: int) -> bool:
    """True when `pid` is a running (not zombie) process that started at `expected_start` (0: unknown, so
    any process under that pid counts)."""
    if pid <= 0:
        return False
    fields = _stat_fields(pid)
    if fields is None:
        if os.path.isdir(_PROC):
            return False
        return _kill_probe(pid)
    if fields[0] in ("Z", "X", "x"):
        return False
    return expected_start == 0 or int(fields[19]) == expected_start


def _kill_probe(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
