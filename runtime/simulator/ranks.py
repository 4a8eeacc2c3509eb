"""The engine's tensor-parallel ranks: light forked processes that walk SGLang's scheduler loop for real.

Each rank attaches the pod's real ledger (`attach_rank`: slot = local index, rank = global TP rank) and, every
iteration, crosses the phases and collectives SGLang's loop crosses:

    collective(RECV_BROADCAST)      recv_requests' broadcast          -> barrier "recv"
    begin(LOCAL)
    collective(<the role's KV poll>) PD loops poll their KV transfers -> barrier "kv_poll"
    begin(FORWARD) while a batch runs, else begin(IDLE)
    step()

A collective is a real rendezvous: one `multiprocessing.Barrier` per collective kind, shared by the pod's
ranks. So a rank that enters another collective than its peers (the `desync` fault) leaves everyone blocked,
each in its own barrier, with the ledger showing it: exactly the failure the operator detects.

The collectives of a multi-node group cross its pods, as NCCL's do: the rank that completes a pod's barrier
(its action) waits, before anyone is released, until every pod of the group entered the same collective
(`rendezvous.Link.meet`, through node rank 0's server). So a pod whose barrier never completes (a rank in
another collective, hung or dead) holds every pod's ranks in theirs. A single-pod engine's barriers have no
action: no network, no cost.

The KV poll is recorded under the phase pdfleet's rank instrumentation gives SGLang's first KV poll of the
role's loop: a decode rank's transfer-queue poll (DECODE_TRANSFER_POLL, in `pop_transferred`), a prefill
rank's bootstrap-queue poll (PREFILL_BOOTSTRAP_POLL, in `pop_bootstrapped`). So a desync's evidence names
the same collective as on a real engine.

Requests advance only while the loop turns: rank 0 writes one byte per iteration to a pipe the HTTP side
counts (`ticks`), and every prefill and decode step waits for it. A stuck loop stalls every request while
/health still answers, as in production.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import multiprocessing
import multiprocessing.synchronize
import os
import signal
import threading
import time
from multiprocessing.sharedctypes import Synchronized

from pdfleet.runtime.health import attach, phases
from pdfleet.runtime.health import writer as rank_writer
from pdfleet.runtime.simulator.config import Engine, Timing
from pdfleet.runtime.simulator.faults import Asked, Fault
from pdfleet.runtime.simulator.rendezvous import Crossing, Link

log = logging.getLogger(__name__)

_CTX = multiprocessing.get_context("fork")
_PR_SET_PDEATHSIG = 1
_RECV = phases.Phase.RECV_BROADCAST
_KV_POLL = phases.Phase.KV_POLL_ALL_REDUCE  # the barrier's key; the ledger gets `kv_poll_phase(engine)`
_ROLE_POLL = {"decode": phases.Phase.DECODE_TRANSFER_POLL, "prefill": phases.Phase.PREFILL_BOOTSTRAP_POLL}


def kv_poll_phase(engine: Engine) -> phases.Phase:
    """The ledger phase of the role's KV poll, as the instrumentation records it on a real engine."""
    return _ROLE_POLL.get(engine.mode, phases.Phase.KV_POLL_ALL_REDUCE)


class Control:
    """What the HTTP side tells the ranks, in shared memory: the fault asked for, whether a batch is running,
    and when to stop."""

    def __init__(self, ranks: int, crossing: Crossing | None = None) -> None:
        self.fault: Synchronized[int] = _CTX.Value("i", 0, lock=False)  # type: ignore[assignment]
        self.fault_rank: Synchronized[int] = _CTX.Value("i", ranks - 1, lock=False)  # type: ignore[assignment]
        self.delay_ms: Synchronized[int] = _CTX.Value("i", 0, lock=False)  # type: ignore[assignment]
        # `straggle`: one stall of `stall_ms` per ask; a rank stalls when the count moves past what it saw.
        self.stall_ms: Synchronized[int] = _CTX.Value("i", 0, lock=False)  # type: ignore[assignment]
        self.stalls: Synchronized[int] = _CTX.Value("i", 0, lock=False)  # type: ignore[assignment]
        self.stop: Synchronized[int] = _CTX.Value("i", 0, lock=False)  # type: ignore[assignment]
        self.busy = _CTX.Event()
        self.crossing = crossing
        # Collectives this pod completed (multi-node only): the number its pods meet under. Written only by the
        # action of a completing barrier, and one barrier completes at a time: all the pod's ranks are in it.
        self.crossed: Synchronized[int] = _CTX.Value("q", 0, lock=False)  # type: ignore[assignment]
        self.link: Link | None = None  # per rank process: set after the fork, by the rank that owns it
        self.barriers = {kind: _CTX.Barrier(ranks, action=functools.partial(self._cross, kind.label)
                                            if crossing is not None else None) for kind in (_RECV, _KV_POLL)}
        # Never complete: where every rank waits under the `hang` fault.
        self.never = _CTX.Barrier(ranks + 1)
        self._ranks = ranks
        # The HTTP side's own (not shared with the ranks): what `failing` and `slow-requests` apply, and the
        # requests sent so far (for faults that start after some).
        self.fail_share = 0.0
        self.latency_factor = 1.0
        self.requests = 0

    def ask(self, asked: Asked) -> None:
        rank = asked.rank if asked.rank is not None else self._ranks - 1
        self.fault_rank.value = min(max(rank, 0), self._ranks - 1)
        self.delay_ms.value = asked.forward_delay_ms
        self.stall_ms.value = asked.stall_ms
        self.fail_share = asked.fail_share if asked.fault is Fault.FAILING else 0.0
        self.latency_factor = asked.latency_factor if asked.fault is Fault.SLOW_REQUESTS else 1.0
        if asked.fault is Fault.STRAGGLE:
            self.stalls.value += 1
        self.fault.value = int(asked.fault)

    def _cross(self, kind: str) -> None:
        """A barrier's action, in the rank that completed it: hold the pod's ranks until every pod is there."""
        self.crossed.value += 1
        if self.link is not None:
            self.link.meet(self.crossed.value, kind)

    def release_all(self) -> None:
        """Break every barrier: a blocked rank wakes up (with BrokenBarrierError) and can exit."""
        self.stop.value = 1
        for b in (*self.barriers.values(), self.never):
            b.abort()


class _Stop(Exception):
    pass


def _loop(engine: Engine, timing: Timing, control: Control, slot: int, tick_fd: int) -> None:
    writer = attach.attach_rank(slot=slot, rank=engine.first_rank + slot, slots=engine.local_ranks)
    loop, wrong = engine.loop(), engine.wrong_loop()
    poll = kv_poll_phase(engine)
    latched = Fault.NONE  # desync, hang and dead-rank never heal
    stalls_seen = control.stalls.value
    try:
        if control.crossing is not None:
            # torch.distributed's rendezvous comes before the event loop: the ledger says STARTING meanwhile.
            control.link = Link(control.crossing, rank=engine.first_rank + slot,
                                stopped=lambda: bool(control.stop.value))
            if not control.link.join():
                raise _Stop
        writer.set_loop(loop)
        while not control.stop.value:
            fault = Fault(control.fault.value)
            if fault in (Fault.DESYNC, Fault.HANG, Fault.DEAD_RANK) and latched is Fault.NONE:
                latched = fault
            mine = control.fault_rank.value == slot
            if latched is Fault.DEAD_RANK and mine:
                os._exit(17)  # a crash: no goodbye in the ledger
            writer.set_loop(wrong if fault is Fault.WRONG_EVENT_LOOP else loop)
            _collective(writer, control, _RECV)
            writer.begin(phases.Phase.LOCAL)
            if control.stalls.value != stalls_seen:
                stalls_seen = control.stalls.value
                if mine:  # stuck in its own code while its peers go on into the next collective
                    time.sleep(control.stall_ms.value / 1000)
            if engine.pd:
                if latched is Fault.HANG:
                    writer.collective(poll)
                    control.never.wait()
                if latched is Fault.DESYNC and mine:
                    # Skips the KV poll its peers enter: it waits in the next broadcast, they in the poll.
                    _collective(writer, control, _RECV)
                _collective(writer, control, _KV_POLL, poll)
            elif latched is Fault.HANG or (latched is Fault.DESYNC and mine):
                # No KV poll outside PD: the odd rank goes into a collective its peers never enter.
                writer.collective(phases.Phase.OTHER_COLLECTIVE if latched is Fault.DESYNC else _RECV)
                control.never.wait()
            if control.busy.is_set():
                writer.begin(phases.Phase.FORWARD)
                slow = fault is Fault.SLOW
                time.sleep(control.delay_ms.value / 1000 if slow else timing.decode_step_s)
                if fault is Fault.TOKEN_DIVERGENCE and latched is Fault.NONE and engine.tp_size > 1 \
                        and not engine.token_agreement:
                    latched = Fault.DESYNC  # the fault rank sampled its own token: its next batch differs
            else:
                writer.begin(phases.Phase.IDLE)
                control.busy.wait(timing.idle_step_s)
            writer.step()
            if slot == 0:
                # A full pipe means the reader is behind: it counts what it gets, and never blocks a rank.
                with contextlib.suppress(BlockingIOError):
                    os.write(tick_fd, b"\0")
    except (_Stop, threading.BrokenBarrierError):  # SIGTERM, or `stop()` breaking the barriers: asked to go
        pass
    # Only a loop that ended as asked says goodbye: an exception out of it is a crash and must read as Dead.
    writer.close()


def _collective(writer: rank_writer.RankWriter, control: Control, barrier: phases.Phase,
                recorded: phases.Phase | None = None) -> None:
    """Enter the `barrier` rendezvous, recorded in the ledger as `recorded` (the barrier's own phase if None)."""
    writer.collective(recorded or barrier)
    control.barriers[barrier].wait()


def _rank_main(engine: Engine, timing: Timing, control: Control, slot: int, tick_fd: int, parent: int) -> None:
    # Die with the engine process, however it ends: never leave a rank behind.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    # The engine died before the signal was armed. Not `getppid() == 1`: in a container the engine is pid 1, and
    # every rank exited at once that way (seen on a real kubelet node: ranks never in the event loop).
    if os.getppid() != parent:
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def on_term(signum: int, frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, on_term)
    _loop(engine, timing, control, slot, tick_fd)
    os._exit(0)


class RankGroup:
    """The pod's ranks: `start()` forks them, `stop()` ends them and reaps every one."""

    def __init__(self, engine: Engine, timing: Timing, control: Control) -> None:
        self.engine = engine
        self.timing = timing
        self.control = control
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.tick_read, self._tick_write = os.pipe()
        os.set_blocking(self._tick_write, False)
        os.set_blocking(self.tick_read, False)

    def start(self) -> RankGroup:
        for slot in range(self.engine.local_ranks):
            p = _CTX.Process(target=_rank_main, name=f"pdfleet-sim-rank-{slot}", daemon=True,
                             args=(self.engine, self.timing, self.control, slot, self._tick_write, os.getpid()))
            p.start()
            self.procs.append(p)
        return self

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask every rank to finish its iteration, break the barriers the blocked ones wait in, then reap;
        a rank that does not go in time is killed."""
        self.control.release_all()
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                log.warning("simulator: rank %s did not exit; killing it", p.name)
                p.kill()
                p.join(1.0)
        for fd in (self.tick_read, self._tick_write):
            with contextlib.suppress(OSError):
                os.close(fd)
