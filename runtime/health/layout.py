"""The byte layout of a ledger file: a header, then one fixed-size slot per local rank.

Every field is an aligned little-endian unsigned 64-bit word, so a single field is written by one aligned
store (atomic on x86-64 and aarch64) through a `memoryview` cast to "Q". A slot is 128 bytes, two whole
cache lines, so ranks running on different cores never write the same line (no false sharing).

Slot words (index within the slot):
    SEQ          seqlock counter: odd while a multi-word update is in flight, even otherwise
    PID          writer process id (0: the slot was never attached)
    PID_START    writer process start time in clock ticks since boot (/proc/<pid>/stat field 22), so a
                 reader can tell the writer from a later process that reuses its pid (0: unknown)
    RANK         the rank's global rank in its group (the slot index is only the local rank)
    LOOP         `phases.LoopName` id
    STACK_SIGNAL signal number that makes the rank dump its stacks (0: none registered; never signal it)
    ITERATION    loop iterations completed
    COLLECTIVES  collectives entered
    PHASE        `phases.Phase` id; EXITED is terminal: the rank left its loop cleanly, and a record that
                 ends otherwise, its process gone, is a crash
    PHASE_SINCE  `time.monotonic_ns()` when the current phase began (the writer host's clock); for EXITED,
                 when the rank exited
    ATTACHED_NS  `time.monotonic_ns()` when the writer attached
    (words 11-15 are reserved and zero)

Header words: MAGIC, VERSION, SLOTS, SLOT_WORDS (then reserved zeros up to HEADER_WORDS).
"""

from __future__ import annotations

WORD = 8
MAGIC = int.from_bytes(b"PDFLEDGR", "little")
VERSION = 1

HEADER_WORDS = 16
SLOT_WORDS = 16

H_MAGIC, H_VERSION, H_SLOTS, H_SLOT_WORDS = range(4)

(
    SEQ,
    PID,
    PID_START,
    RANK,
    LOOP,
    STACK_SIGNAL,
    ITERATION,
    COLLECTIVES,
    PHASE,
    PHASE_SINCE,
    ATTACHED_NS,
) = range(11)


def file_size(slots: int) -> int:
    """Bytes a ledger with `slots` slots occupies."""
    return (HEADER_WORDS + slots * SLOT_WORDS) * WORD


def slot_base(slot: int) -> int:
    """Index of a slot's first word in the file viewed as 64-bit words."""
    return HEADER_WORDS + slot * SLOT_WORDS
