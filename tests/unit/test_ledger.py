"""The shared-memory ledger: layout round trip, geometry checks, and the seqlock under real concurrency."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.runtime.health import layout, ledger, phases
from tests.support import requires

Phase = phases.Phase


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger"


@pytest.fixture
def led(path: Path) -> Iterator[ledger.Ledger]:
    with ledger.Ledger.open(path, slots=4) as opened:
        yield opened


def _child(script: str, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], text=True, capture_output=True, timeout=60, check=True, **kwargs
    )


def test_a_written_record_reads_back_field_by_field(led: ledger.Ledger) -> None:
    w = led.writer(2, rank=6)
    w.set_loop(phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE)
    w.set_stack_signal(12)
    before = time.monotonic_ns()
    w.collective(Phase.RECV_BROADCAST)
    w.begin(Phase.LOCAL)
    w.collective(Phase.KV_POLL_ALL_REDUCE)
    w.step()
    after = time.monotonic_ns()

    [record] = led.read_all()

    assert record.slot == 2
    assert record.rank == 6
    assert record.pid == os.getpid()
    assert record.loop is phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE
    assert record.phase is Phase.KV_POLL_ALL_REDUCE
    assert record.collectives == 2
    assert record.iteration == 1
    assert record.stack_signal == 12
    assert before <= record.phase_since_ns <= after
    assert record.consistent


def test_a_freshly_attached_rank_is_starting_at_zero_counts(led: ledger.Ledger) -> None:
    led.writer(0, rank=0)

    [record] = led.read_all()

    assert (record.phase, record.iteration, record.collectives) == (Phase.STARTING, 0, 0)
    assert record.loop is phases.LoopName.UNKNOWN


def test_slots_nobody_attached_to_are_not_reported(led: ledger.Ledger) -> None:
    led.writer(1, rank=1)
    led.writer(3, rank=3)

    assert [r.slot for r in led.read_all()] == [1, 3]
    assert led.read(0) is None


def test_ranks_write_only_their_own_slot(led: ledger.Ledger) -> None:
    a = led.writer(0, rank=0)
    b = led.writer(1, rank=1)
    a.collective(Phase.RECV_BROADCAST)
    a.step()
    b.begin(Phase.FORWARD)

    first, second = led.read_all()

    assert (first.phase, first.collectives, first.iteration) == (Phase.RECV_BROADCAST, 1, 1)
    assert (second.phase, second.collectives, second.iteration) == (Phase.FORWARD, 0, 0)


def test_a_reader_in_another_mapping_sees_the_writes(led: ledger.Ledger, path: Path) -> None:
    w = led.writer(0, rank=0)
    with ledger.Ledger.open_readonly(path) as reader:
        w.begin(Phase.IDLE)
        assert reader.slots == 4
        assert reader.read_all()[0].phase is Phase.IDLE


def test_a_new_owner_replaces_the_record_and_the_seqlock_counter_keeps_growing(led: ledger.Ledger) -> None:
    old = led.writer(0, rank=0)
    for _ in range(5):
        old.collective(Phase.RECV_BROADCAST)
    seq_before = led._words[layout.slot_base(0) + layout.SEQ]

    led.writer(0, rank=0)

    record = led.read(0)
    assert record is not None
    assert (record.phase, record.collectives) == (Phase.STARTING, 0)
    assert led._words[layout.slot_base(0) + layout.SEQ] > seq_before


def test_a_closed_writer_leaves_an_exited_record_that_no_one_may_signal(led: ledger.Ledger) -> None:
    w = led.writer(0, rank=0)
    w.set_stack_signal(12)
    w.close()
    w.close()

    record = led.read(0)
    assert record is not None
    assert (record.phase, record.stack_signal) == (Phase.EXITED, 0)


def test_opening_an_existing_ledger_with_another_slot_count_is_refused(led: ledger.Ledger, path: Path) -> None:
    with pytest.raises(ledger.LedgerError, match="has 4 slots"):
        ledger.Ledger.open(path, slots=8)


def test_a_file_that_is_not_a_ledger_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_bytes(b"x" * 4096)

    with pytest.raises(ledger.LedgerError, match="not a pdfleet ledger"):
        ledger.Ledger.open_readonly(other)
    with pytest.raises(ledger.LedgerError, match="not a pdfleet ledger"):
        ledger.Ledger.open(other, slots=1)


def test_reading_before_any_rank_created_the_ledger_says_file_not_found(path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ledger.Ledger.open_readonly(path)


def test_a_slot_outside_the_ledger_cannot_be_claimed(led: ledger.Ledger) -> None:
    with pytest.raises(ValueError, match="outside"):
        led.writer(4, rank=4)


def test_the_path_comes_from_the_environment_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ledger.PATH_ENV, "/tmp/somewhere")
    assert ledger.default_path() == Path("/tmp/somewhere")
    monkeypatch.delenv(ledger.PATH_ENV)
    assert ledger.default_path() == Path(ledger.DEFAULT_PATH)


def test_a_writer_killed_mid_update_leaves_a_record_marked_inconsistent_and_the_reader_returns(
    led: ledger.Ledger,
) -> None:
    w = led.writer(0, rank=0)
    w.begin(Phase.FORWARD)
    led._words[layout.slot_base(0) + layout.SEQ] += 1  # what a SIGKILL between the two bumps leaves

    started = time.monotonic()
    record = led.read(0, max_wait_s=0.05)

    assert time.monotonic() - started < 1.0
    assert record is not None
    assert not record.consistent
    assert record.phase is Phase.FORWARD


def test_ranks_of_several_processes_create_one_ledger_together(path: Path) -> None:
    script = (
        "import sys\n"
        "from pdfleet.runtime.health import ledger, phases\n"
        "led = ledger.Ledger.open(sys.argv[1], 4)\n"
        "w = led.writer(int(sys.argv[2]), rank=int(sys.argv[2]))\n"
        "w.collective(phases.Phase.RECV_BROADCAST)\n"
    )
    children = [subprocess.Popen([sys.executable, "-c", script, str(path), str(slot)]) for slot in range(4)]
    try:
        assert [child.wait(timeout=60) for child in children] == [0, 0, 0, 0]
    finally:
        for child in children:
            child.kill()
            child.wait()

    with ledger.Ledger.open_readonly(path) as reader:
        assert [(r.slot, r.phase, r.collectives) for r in reader.read_all()] == [
            (slot, Phase.RECV_BROADCAST, 1) for slot in range(4)
        ]


_HAMMER = """
import sys
from pdfleet.runtime.health import ledger, phases
led = ledger.Ledger.open(sys.argv[1], 1)
w = led.writer(0, rank=0)
# Every update keeps one invariant between two words: phase == RECV_BROADCAST + collectives % 4.
# A torn read (new count, old phase) breaks it.
first = phases.Phase.RECV_BROADCAST
n = 0
while True:
    n += 1
    w.collective(first + n % 4)
"""


def test_a_reader_never_sees_a_torn_record_while_another_process_writes_flat_out(path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", _HAMMER, str(path)])
    try:
        reader = _wait_for_ledger(path)
        seen = 0
        while seen < 20_000:
            record = reader.read(0)
            if record is None or not record.consistent:
                continue
            seen += 1
            assert record.phase == Phase.RECV_BROADCAST + record.collectives % 4, record
        assert child.poll() is None, "the writer died: the reads proved nothing"
        assert reader.read(0).collectives > 1000  # type: ignore[union-attr]
        reader.close()
    finally:
        child.kill()
        child.wait()


def _wait_for_ledger(path: Path, timeout_s: float = 30.0) -> ledger.Ledger:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            reader = ledger.Ledger.open_readonly(path)
            if reader.read(0) is not None:
                return reader
            reader.close()
        except (FileNotFoundError, ledger.LedgerError):
            if time.monotonic() > deadline:
                raise
        time.sleep(0.01)


_STEPS = """
import sys
from pdfleet.runtime.health import ledger, phases
P = phases.Phase
led = ledger.Ledger.open(sys.argv[1], 1)
w = led.writer(0, rank=0)
for _ in range(int(sys.argv[2])):
    w.collective(P.RECV_BROADCAST); w.begin(P.LOCAL); w.collective(P.KV_POLL_ALL_REDUCE)
    w.begin(P.FORWARD); w.step()
"""


def test_the_hot_path_makes_no_system_calls(tmp_path: Path) -> None:
    requires.program("strace")

    def syscalls(steps: int) -> int:
        trace = tmp_path / f"trace-{steps}"
        result = subprocess.run(
            ["strace", "-f", "-qq", "-o", str(trace), sys.executable, "-c", _STEPS, str(tmp_path / "l"), str(steps)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0 and "ptrace" in result.stderr:
            pytest.fail(f"strace cannot trace here (ptrace is not permitted): {result.stderr.strip()}")
        assert result.returncode == 0, result.stderr
        return len(trace.read_text().splitlines())

    assert syscalls(100_000) - syscalls(0) <= 5


def test_the_hot_path_leaves_nothing_allocated(led: ledger.Ledger) -> None:
    def steps(n: int) -> None:
        for _ in range(n):
            w.collective(Phase.RECV_BROADCAST)
            w.begin(Phase.FORWARD)
            w.step()

    w = led.writer(0, rank=0)
    steps(1000)  # the writer's counters become ints it then keeps (one object each), whatever n is
    before = sys.getallocatedblocks()
    steps(50_000)
    assert sys.getallocatedblocks() - before <= 2
