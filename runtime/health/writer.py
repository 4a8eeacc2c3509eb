"""`RankWriter`: the ledger code that runs inside a scheduler rank's event loop, on every step.

Cost is the design constraint: a few hundred nanoseconds per step, no locks, no system calls, nothing
that outlives the call allocated. So each method is a handful of stores through a `memoryview` cast to
64-bit words (one aligned store per field, no struct packing) and `time.monotonic_ns()` (a vDSO read of the
clock, not a system call, on Linux with a TSC or kvm clocksource). The ints CPython makes for the values
are transient objects from its own small-object allocator, gone when the call returns. (Packing the phase
and its start time into one word to save the seqlock was measured and is slower: the big-int shifts cost
more than two extra stores.)

Consistency for readers, without locks:
- Updates of several words (`begin`, `collective`) are bracketed by the seqlock counter: odd while in
  flight, even after.
- `step` and the rare setters change one word; one aligned store is atomic, so they need nothing more.
- The reader (`ledger`) copies the slot twice and accepts only two equal copies with an even counter.
  Every word only moves forward while a writer owns the slot (counters and clock stamps grow), so equal
  copies mean nothing changed in between: the copy is the slot as it was at one instant.
This relies on stores becoming visible in program order, which x86-64 guarantees. Pure Python has no fence
to offer on weaker memory models (aarch64); a reader there may in rare cases see a mix, which the verdict
tolerates because it acts only on states that persist for seconds.
"""

from __future__ import annotations

import time

from pdfleet.runtime.health import layout, phases

_SEQ = layout.SEQ
_LOOP = layout.LOOP
_STACK_SIGNAL = layout.STACK_SIGNAL
_ITERATION = layout.ITERATION
_COLLECTIVES = layout.COLLECTIVES
_PHASE = layout.PHASE
_PHASE_SINCE = layout.PHASE_SINCE
_now = time.monotonic_ns


class RankWriter:
    """Writes one rank's slot. Owned by exactly one thread of one process: the scheduler's loop thread.

    One iteration of a PD event loop, instrumented:
        writer.collective(Phase.RECV_BROADCAST)   # entering recv_requests' broadcast
        writer.begin(Phase.LOCAL)                 # it returned: scheduling
        writer.collective(Phase.KV_POLL_ALL_REDUCE)
        writer.begin(Phase.FORWARD)
        writer.step()                             # the iteration is complete

    End a collective with `begin(...)` of whatever comes next, so that a rank stuck in its own code is
    never mistaken for a rank waiting on its peers. There is deliberately no context manager: `with`
    costs an extra call per phase, and a phase ends where the next one begins anyway.
    """

    __slots__ = ("_collectives", "_iteration", "_seq", "_words", "rank", "slot")

    def __init__(self, slot_words: memoryview, *, slot: int, rank: int, pid: int, pid_start: int) -> None:
        """Claims the slot for this process: every field is rewritten under the seqlock, so a reader sees
        either the previous owner's record or this one, never a mix. `slot_words` is this slot's
        `SLOT_WORDS` words (from `Ledger.writer`)."""
        self._words = slot_words
        self.slot = slot
        self.rank = rank
        self._iteration = 0
        self._collectives = 0
        # Continue the previous owner's counter: readers rely on it never going back.
        seq = slot_words[_SEQ] | 1
        now = _now()
        slot_words[_SEQ] = seq
        for i in range(1, layout.SLOT_WORDS):
            slot_words[i] = 0
        slot_words[layout.PID] = pid
        slot_words[layout.PID_START] = pid_start
        slot_words[layout.RANK] = rank
        slot_words[_PHASE] = phases.Phase.STARTING
        slot_words[_PHASE_SINCE] = now
        slot_words[layout.ATTACHED_NS] = now
        self._seq = seq + 1
        slot_words[_SEQ] = self._seq

    def begin(self, phase: phases.Phase) -> None:
        """Enter a phase that is not a collective (forward, idle, local work), stamped with its start."""
        words = self._words
        seq = self._seq + 1
        words[_SEQ] = seq
        words[_PHASE] = phase
        words[_PHASE_SINCE] = _now()
        seq += 1
        words[_SEQ] = seq
        self._seq = seq

    def collective(self, phase: phases.Phase) -> None:
        """Enter a collective: count it, and stamp when the wait began, as one update."""
        words = self._words
        seq = self._seq + 1
        count = self._collectives + 1
        words[_SEQ] = seq
        words[_COLLECTIVES] = count
        words[_PHASE] = phase
        words[_PHASE_SINCE] = _now()
        seq += 1
        words[_SEQ] = seq
        self._seq = seq
        self._collectives = count

    def step(self) -> None:
        """One loop iteration completed: the progress signal."""
        self._iteration = n = self._iteration + 1
        self._words[_ITERATION] = n

    def set_loop(self, loop: phases.LoopName) -> None:
        """Record which event loop this rank runs (once, when SGLang dispatches it)."""
        self._words[_LOOP] = loop

    def set_stack_signal(self, signum: int) -> None:
        """Advertise the signal on which this process dumps its stacks (see `stacks.install_dumper`).
        Readers never send a signal a rank did not advertise: its default action would kill the rank."""
        self._words[_STACK_SIGNAL] = signum

    def close(self) -> None:
        """Mark the rank as exited cleanly (phase EXITED, stamped with when) and let go of the shared memory.
        Idempotent. Call it only where the loop ended as asked (a shutdown), never from a `finally` or an
        `atexit` hook: a crash must leave the record as it was, so that the rank reads as Dead."""
        try:
            self._words[_STACK_SIGNAL] = 0
        except ValueError:  # already closed: the view is released
            return
        self.begin(phases.Phase.EXITED)
        self._words.release()
