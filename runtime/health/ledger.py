"""The ledger file of one engine pod: opening it, attaching rank writers, reading consistent records.

One file per pod (a shared-memory file, under /dev/shm by default) with one slot per local rank. Ranks
create-or-attach it with `Ledger.open(path, slots)`; the file lock is taken only while the header is
created or checked, never on the hot path. The agent opens it with `Ledger.open_readonly(path)` and
reads it without ever making a writer wait.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import time
from pathlib import Path
from typing import Self

from pdfleet.runtime.health import layout, procs, records, writer

PATH_ENV = "PDFLEET_LEDGER_PATH"
DEFAULT_PATH = "/dev/shm/pdfleet-ledger"


class LedgerError(Exception):
    """The file is not a ledger this code can use (other geometry, other version, not ready)."""


def default_path() -> Path:
    """The ledger path of this pod: $PDFLEET_LEDGER_PATH, else /dev/shm/pdfleet-ledger."""
    return Path(os.environ.get(PATH_ENV) or DEFAULT_PATH)


class Ledger:
    """A mapped ledger file. Writers hand out slot views; readers copy slots out."""

    def __init__(self, path: Path, mapping: mmap.mmap, slots: int, *, writable: bool) -> None:
        self.path = path
        self.slots = slots
        self.writable = writable
        self._mmap = mapping
        self._words = memoryview(mapping).cast("Q")
        self._writers: list[writer.RankWriter] = []

    @classmethod
    def open(cls, path: str | os.PathLike[str], slots: int) -> Self:
        """Create the ledger with `slots` slots, or attach to the one already there (every rank of the pod
        calls this; whichever comes first creates it). Raises `LedgerError` if an existing file has another
        geometry or version: a pod's ranks must agree on it."""
        if slots < 1:
            raise ValueError(f"a ledger needs at least one slot, not {slots}")
        path = Path(path)
        size = layout.file_size(slots)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o664)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size == 0:
                os.ftruncate(fd, size)
                mapping = mmap.mmap(fd, size)
                _write_header(mapping, slots)
            else:
                mapping = mmap.mmap(fd, 0)
                try:
                    _check_header(path, mapping, expected_slots=slots)
                except LedgerError:
                    mapping.close()
                    raise
        finally:
            # Unlock explicitly: mmap keeps a dup of the fd, which would otherwise hold the lock.
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        return cls(path, mapping, slots, writable=True)

    @classmethod
    def open_readonly(cls, path: str | os.PathLike[str]) -> Self:
        """Map an existing ledger for reading; its geometry comes from its header. Raises
        `FileNotFoundError` before any rank created it, `LedgerError` while it is being created."""
        path = Path(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size < layout.HEADER_WORDS * layout.WORD:
                raise LedgerError(f"{path}: not initialised yet")
            mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        try:
            slots = _check_header(path, mapping, expected_slots=None)
        except LedgerError:
            mapping.close()
            raise
        return cls(path, mapping, slots, writable=False)

    def writer(self, slot: int, *, rank: int) -> writer.RankWriter:
        """Claim `slot` (the rank's local index in this pod) for the calling process."""
        if not self.writable:
            raise LedgerError(f"{self.path} is open read-only")
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} outside 0..{self.slots - 1}")
        base = layout.slot_base(slot)
        pid = os.getpid()
        w = writer.RankWriter(
            self._words[base : base + layout.SLOT_WORDS],
            slot=slot,
            rank=rank,
            pid=pid,
            pid_start=procs.start_ticks(pid),
        )
        self._writers.append(w)
        return w

    def read(self, slot: int, *, max_wait_s: float = 0.01) -> records.RankRecord | None:
        """A consistent snapshot of one slot, or None if no rank ever attached to it.

        Copies the slot twice and accepts two equal copies with an even seqlock counter (see `writer`).
        Retries, yielding the CPU between tries, for at most `max_wait_s`; after that (a writer killed in
        the middle of an update leaves its counter odd forever) it returns the last copy marked
        inconsistent rather than waiting on a process that will never finish.
        """
        start = layout.slot_base(slot) * layout.WORD
        end = start + layout.SLOT_WORDS * layout.WORD
        deadline = time.monotonic() + max_wait_s
        while True:
            first = self._mmap[start:end]
            second = self._mmap[start:end]
            words = memoryview(second).cast("Q")
            consistent = first == second and words[layout.SEQ] % 2 == 0
            if consistent or time.monotonic() >= deadline:
                break
            os.sched_yield()
        if words[layout.PID] == 0:
            return None
        return records.decode(slot, words.tolist(), consistent=consistent)

    def read_all(self) -> list[records.RankRecord]:
        """Snapshots of every attached slot, in slot order."""
        return [r for slot in range(self.slots) if (r := self.read(slot)) is not None]

    def close(self) -> None:
        """Close every writer handed out, then unmap."""
        for w in self._writers:
            w.close()
        self._writers.clear()
        self._words.release()
        self._mmap.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_header(mapping: mmap.mmap, slots: int) -> None:
    """Magic last, so a reader that maps the file mid-creation sees it as not ready."""
    with memoryview(mapping) as raw, raw.cast("Q") as words:
        words[layout.H_VERSION] = layout.VERSION
        words[layout.H_SLOTS] = slots
        words[layout.H_SLOT_WORDS] = layout.SLOT_WORDS
        words[layout.H_MAGIC] = layout.MAGIC


def _check_header(path: Path, mapping: mmap.mmap, *, expected_slots: int | None) -> int:
    """The slot count of a valid ledger header; raises `LedgerError` otherwise."""
    with memoryview(mapping) as raw, raw.cast("Q") as words:
        header = words[: layout.HEADER_WORDS].tolist()
    if header[layout.H_MAGIC] != layout.MAGIC:
        raise LedgerError(f"{path}: not a pdfleet ledger (or not initialised yet)")
    if header[layout.H_VERSION] != layout.VERSION or header[layout.H_SLOT_WORDS] != layout.SLOT_WORDS:
        raise LedgerError(
            f"{path}: ledger version {header[layout.H_VERSION]}, this code reads version {layout.VERSION}"
        )
    slots = header[layout.H_SLOTS]
    if expected_slots is not None and slots != expected_slots:
        raise LedgerError(f"{path}: has {slots} slots, this rank expects {expected_slots}")
    if len(mapping) < layout.file_size(slots):
        raise LedgerError(f"{path}: truncated ({len(mapping)} bytes for {slots} slots)")
    return slots
