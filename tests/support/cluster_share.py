"""Tests share one cluster; a disruptive one (it restarts the apiserver) runs alone on it.

A readers-writer lock across the pytest-xdist workers, on two files: every cluster test holds the lock shared
for its run, a test marked `disruptive` holds it exclusive. The writer first takes the turnstile, which every
reader passes through, so no reader starts after it has asked and it waits only for those already running.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _files(kubeconfig: Path) -> tuple[Path, Path]:
    key = hashlib.sha256(str(kubeconfig.resolve()).encode()).hexdigest()[:12]
    base = Path(tempfile.gettempdir()) / f"pdfleet-cluster-{key}"
    return base.with_suffix(".turnstile"), base.with_suffix(".lock")


@contextlib.contextmanager
def hold(kubeconfig: Path, *, exclusive: bool) -> Iterator[None]:
    """The cluster `kubeconfig` names, shared with other tests or, when `exclusive`, alone."""
    turnstile_path, lock_path = _files(kubeconfig)
    with turnstile_path.open("a") as turnstile, lock_path.open("a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
