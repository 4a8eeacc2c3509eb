"""Cost of the ledger writes one SGLang loop iteration makes, against an empty loop in the same process.

A loop step here is what a scheduler rank writes per iteration of a PD event loop:
    collective(RECV_BROADCAST), begin(LOCAL), collective(KV_POLL_ALL_REDUCE), begin(FORWARD), step()
and, for the minimal sequence in the issue, collective(RECV_BROADCAST), begin(FORWARD), step().
The baseline runs the same loop with the calls going to a no-op object with the same methods, so the
difference is the cost of the ledger itself (stores and the clock), not of Python calling a method.
We also print the cost against an empty loop body, the honest upper bound.

Each figure is the minimum over many short repeats: on a shared machine a short repeat often runs
undisturbed, and the minimum is the figure least inflated by other work (long repeats average in
preemptions and wander by 2x). Runs in well under 20 s.

    python benchmarks/bench_ledger.py [--steps N] [--repeats R]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pdfleet.runtime.health import ledger, phases, writer

TARGET_NS = 1000.0
RECV = phases.Phase.RECV_BROADCAST
KV_POLL = phases.Phase.KV_POLL_ALL_REDUCE
LOCAL = phases.Phase.LOCAL
FORWARD = phases.Phase.FORWARD


class _NoopWriter:
    """Same methods as `RankWriter`, doing nothing: the cost of the calls alone."""

    __slots__ = ()

    def begin(self, phase: phases.Phase) -> None:
        pass

    def collective(self, phase: phases.Phase) -> None:
        pass

    def step(self) -> None:
        pass


def _empty_loop(w: object, n: int) -> int:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        pass
    return time.perf_counter_ns() - t0


def _pd_loop(w: writer.RankWriter | _NoopWriter, n: int) -> int:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        w.collective(RECV)
        w.begin(LOCAL)
        w.collective(KV_POLL)
        w.begin(FORWARD)
        w.step()
    return time.perf_counter_ns() - t0


def _minimal_loop(w: writer.RankWriter | _NoopWriter, n: int) -> int:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        w.collective(RECV)
        w.begin(FORWARD)
        w.step()
    return time.perf_counter_ns() - t0


def _best_ns_per_step(loop: Callable[[object, int], int], w: object, steps: int, repeats: int) -> float:
    gc.disable()
    try:
        return min(loop(w, steps) for _ in range(repeats)) / steps
    finally:
        gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()

    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp, ledger.Ledger.open(Path(tmp) / "ledger", 1) as led:
        w = led.writer(0, rank=0)
        noop = _NoopWriter()
        clocksource = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        print(f"clocksource: {clocksource.read_text().strip() if clocksource.exists() else 'unknown'}")
        empty = _best_ns_per_step(_empty_loop, None, args.steps, args.repeats)
        print(f"empty loop: {empty:.1f} ns/step")
        worst = 0.0
        for name, loop in (("pd step (5 writes)", _pd_loop), ("minimal step (3 writes)", _minimal_loop)):
            calls = _best_ns_per_step(loop, noop, args.steps, args.repeats)
            real = _best_ns_per_step(loop, w, args.steps, args.repeats)
            worst = max(worst, real - empty)
            print(
                f"{name}: {real:.1f} ns/step; {real - empty:.1f} over the empty loop "
                f"({real / max(empty, 1e-9):.1f}x); the ledger's own share {real - calls:.1f} "
                f"(no-op calls {calls:.1f} ns/step, {real / calls:.2f}x)"
            )
        verdict = "met" if worst < TARGET_NS else "MISSED"
        print(f"target under {TARGET_NS:.0f} ns/step over the empty loop: {verdict} (worst {worst:.1f} ns)")


if __name__ == "__main__":
    main()
