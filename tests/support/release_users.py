"""A chart release that test modules share: installed (or upgraded) by each module that uses it, uninstalled by
the last one. Two pytest runs on one cluster, or two xdist workers, may run modules on the same shared operator's
release at once; one module's uninstall would delete the release's ServiceAccount, and with it the token of the
other module's running operator, which then stops on `401 Unauthorized`.

The users are the pids of the processes in a module that uses the release, one line each, in a file beside the
cluster's share lock, read and written under an exclusive lock that the install and the uninstall also hold; a
process that died without leaving is dropped the next time the file is read.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from pdfleet.runtime.health import procs


def _path(kubeconfig: Path, release: str) -> Path:
    key = hashlib.sha256(str(kubeconfig.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"pdfleet-cluster-{key}-release-{release}.users"


def _read(f: IO[str]) -> list[int]:
    f.seek(0)
    return [pid for line in f.read().split() if line.isdigit() and procs.is_alive(pid := int(line), 0)]


def _write(f: IO[str], users: list[int]) -> None:
    f.seek(0)
    f.truncate()
    f.write("".join(f"{pid}\n" for pid in users))
    f.flush()


@contextlib.contextmanager
def using(kubeconfig: Path, release: str, *, install: Callable[[], None],
          uninstall: Callable[[], None]) -> Iterator[None]:
    """Holds `release` for the block: `install` runs on entry, `uninstall` on exit only when no other process
    still uses it."""
    path = _path(kubeconfig, release)
    with path.open("a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            _write(f, [*_read(f), os.getpid()])
            install()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    try:
        yield
    finally:
        with path.open("a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                users = _read(f)
                with contextlib.suppress(ValueError):
                    users.remove(os.getpid())
                _write(f, users)
                if not users:
                    uninstall()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
