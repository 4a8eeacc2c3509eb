"""One rank of the reproduction, and the launcher that starts all of them.

`python -m tests.repro.decode_loop SCENARIO_JSON` imports SGLang once, publishes its config, then forks one
process per rank (forking saves each rank ~10 s of imports on a small machine; nothing has started a thread
or a process group yet). Each rank joins a real gloo group on 127.0.0.1, attaches to the pdfleet ledger,
applies the scenario's patches with pdfleet's patch framework, and runs `run_loop`. The launcher exits when
every rank has; a hung rank never does, so whoever started the launcher must kill its process group.

The loop follows `SchedulerDisaggregationDecodeMixin.event_loop_overlap_disagg_decode` in SGLang 0.5.23:
`ingest_requests` (request broadcast), `process_decode_queue` (KV poll of the transfer queue), then a batch
(forward) or `on_idle`. Both steps are SGLang's own methods; only the forward is simulated (a pause: its
collectives are shared by all ranks and cannot diverge while the batches agree).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from pdfleet.runtime.health import attach, phases, writer
from pdfleet.runtime.instrument import seams
from tests.repro import health_check, prefill, rank_hooks, stage
from tests.repro import scenario as scenario_mod

LOOP = phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE


def instrument(rank_writer: writer.RankWriter) -> stage.PhaseLog:
    """pdfleet's rank instrumentation, installed as the engine launcher installs it (after the catalogue
    patches, over them): its seams step the iteration in `Scheduler.ingest_requests` and mark SGLang's KV polls
    with the phase of the queue that entered them; the patches mark their own collectives. The request
    broadcast is marked by `stage.BroadcastReceiver`. Returns the writer everything now writes through."""
    from pdfleet.runtime.instrument import apply, seams

    log = stage.PhaseLog(rank_writer)
    seams.use(log)
    apply.install(scenario_mod.SGLANG_VERSION)
    return log


def _apply_patches(patch_ids: tuple[str, ...]) -> list[str]:
    from pdfleet.runtime.patches import base, registry

    applied = base.apply(patch_ids, scenario_mod.SGLANG_VERSION, registry.implementations(patch_ids))
    return [a.id for a in applied]


def _patched_targets() -> dict[str, str]:
    """Which of SGLang's functions this process runs patched, read back from SGLang itself."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue, DecodeTransferQueue
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler

    found = {}
    for owner in (Scheduler, DecodeTransferQueue, DecodePreallocQueue, PrefillBootstrapQueue, ScheduleBatch):
        for name in ("abort_request", "process_input_requests", "_poll_timeout_aborts", "pop_transferred",
                     "_poll_with_metadata_gate", "process_decode_queue", "_update_handshake_waiters",
                     "pop_bootstrapped", "process_disagg_prefill_inflight_queue",
                     "resolve_waiting_queue_bootstrap", "process_prefill_chunk", "is_fully_idle",
                     "update_running_batch", "check_decode_mem", "pop_preallocated", "resume_retracted_reqs"):
            patch_id = getattr(getattr(owner, name, None), "__pdfleet_patch__", None)
            if patch_id:
                found[f"{owner.__name__}.{name}"] = patch_id
    return found


def run_loop(sc: scenario_mod.Scenario, rank: int, group: Any, rank_writer: seams.Writer) -> dict[str, Any]:
    """The decode loop for `sc.iterations` iterations; returns what happened to each request, by iteration."""
    from sglang.srt.managers.io_struct import AbortReq

    iteration = 0
    receiver = stage.BroadcastReceiver(rank, group, rank_writer, inbox=lambda: _inbox(sc, iteration))
    scheduler, queue = stage.build(rank, group, receiver)
    prealloc = scheduler.disagg_decode_prealloc_queue
    signals = sc.local_aborts.get(rank, {})
    running: dict[str, int] = {}  # rid -> forwards left
    events: dict[str, dict[str, int]] = {"dropped": {}, "transferred": {}, "finished": {}}
    iteration_ns: list[int] = []  # each iteration's wall time on this rank (tests.repro.overhead reads it)
    rank_writer.set_loop(LOOP)
    for iteration in range(sc.iterations):
        started_ns = time.perf_counter_ns()
        rank_hooks.before_intake(sc, rank, iteration, rank_writer)  # a straggle, or this rank's death
        held = {d.req.rid for d in [*queue.queue, *prealloc.queue]}
        # SGLang: rank 0's aborts ride broadcast_pyobj; abort_request on every rank. Its seam steps the iteration.
        scheduler.ingest_requests()
        if iteration in signals:  # a rank-local abort decision (a per-rank clock, a local error handler)
            scheduler.abort_request(AbortReq(rid=signals[iteration]))
        # This rank's own memory retracted a request, or resumed it (only this rank sees its allocators).
        prealloc.retracted_queue = [f"retracted-on-{rank}"] if sc.holds_retracted(rank, iteration) else []
        if sc.held_releases.get(rank) == iteration:  # a release held on this rank only (what no 0.5.23 path does)
            queue._deferred_releases.append(stage.held_release(f"held-on-{rank}"))
        scheduler.process_decode_queue()  # SGLang: retraction gate, handshake poll, pop_transferred
        rank_writer.begin(phases.Phase.LOCAL)
        for req in scheduler.waiting_queue:
            running[req.rid] = sc.decode_steps
            events["transferred"][req.rid] = iteration
        scheduler.waiting_queue.clear()
        now_held = {d.req.rid for d in [*queue.queue, *prealloc.queue]}
        for rid in (held | set(sc_arrivals(sc, iteration))) - now_held - set(events["transferred"]):
            events["dropped"].setdefault(rid, iteration)
        if running:
            rank_writer.begin(phases.Phase.FORWARD)
            time.sleep(sc.forward_s)
            for rid in list(running):
                running[rid] -= 1
                if running[rid] == 0:
                    del running[rid]
                    events["finished"][rid] = iteration
        else:
            rank_writer.begin(phases.Phase.IDLE)
            time.sleep(sc.idle_s)
        iteration_ns.append(time.perf_counter_ns() - started_ns)
    return {"rank": rank, "iterations": sc.iterations, "iteration_ns": iteration_ns, **events}


def sc_arrivals(sc: scenario_mod.Scenario, iteration: int) -> list[str]:
    return [rid for rid, _ in [*sc.arrivals.get(iteration, []), *sc.handshakes.get(iteration, [])]]


def _inbox(sc: scenario_mod.Scenario, iteration: int) -> list[tuple[Any, ...]]:
    """What rank 0 broadcasts this iteration: transfers, then requests for the prealloc queue."""
    handshakes = [(stage.HANDSHAKE, rid, polls) for rid, polls in sc.handshakes.get(iteration, [])]
    return [*sc.arrivals.get(iteration, []), *handshakes]


def join(sc: scenario_mod.Scenario, rank: int) -> writer.RankWriter:
    """This rank's place in SGLang's config, its ledger slot, and the gloo group (127.0.0.1)."""
    import torch.distributed as dist

    stage.set_rank(rank, sc.world)
    rank_writer = attach.attach_rank(slot=rank, rank=rank, slots=sc.world, path=sc.ledger, stack_signal=None)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{sc.port}", rank=rank, world_size=sc.world,
        timeout=datetime.timedelta(seconds=sc.gloo_timeout_s),
    )
    return rank_writer


def rank_main(sc: scenario_mod.Scenario, rank: int) -> None:
    """One rank process: group, ledger, patches, loop, result file."""
    import torch.distributed as dist

    rank_writer = join(sc, rank)
    applied = _apply_patches(sc.patches)
    log = instrument(rank_writer)
    loop = prefill.run_loop if sc.role == "prefill" else health_check.run_loop if sc.health_checks else run_loop
    result = loop(sc, rank, dist.group.WORLD, log)
    result.update(applied=applied, patched=_patched_targets(), collectives_entered=log.labels())
    sc.result_path(rank).write_text(json.dumps(result))
    log.close()


def run_story(sc: scenario_mod.Scenario, rank: int,
              story_loop: Callable[[scenario_mod.Scenario, int, Any, Any], dict[str, Any]]) -> None:
    """One rank of a story module (flush, session): group, ledger, patches, `story_loop`, result file."""
    import torch.distributed as dist

    rank_writer = join(sc, rank)
    applied = _apply_patches(sc.patches)
    log = instrument(rank_writer)
    result = story_loop(sc, rank, dist.group.WORLD, log)
    result.update(applied=applied, collectives_entered=log.labels())
    sc.result_path(rank).write_text(json.dumps(result))
    log.close()


def _die_with_parent() -> None:
    """Linux: be killed when the parent dies, so a killed test run leaves no rank behind (best effort; the
    test also kills the whole session)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def launch(sc: scenario_mod.Scenario,
           rank_fn: Callable[[scenario_mod.Scenario, int], None] = rank_main) -> int:
    """Fork the ranks, each running `rank_fn(sc, rank)`, and wait for them; the exit status is the first
    failure's in time, or 0 (a rank killed by a signal: 128 + the signal, as a shell reports it)."""
    import warnings

    _die_with_parent()
    warnings.simplefilter("ignore")
    # Import once, before forking: each rank would otherwise spend ~10 s on it.
    import sglang.srt.disaggregation.decode
    import sglang.srt.disaggregation.prefill
    import sglang.srt.managers.scheduler  # noqa: F401

    stage.publish_context(sc.world, sc.role)
    children = []
    for rank in range(sc.world):
        pid = os.fork()
        if pid == 0:
            status = 0
            _die_with_parent()
            try:
                rank_fn(sc, rank)
            except BaseException:
                traceback.print_exc()
                status = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        children.append(pid)
    worst = 0
    pending = set(children)
    while pending:  # in the order they end, so that the first failure is the one reported
        pid, status = os.wait()
        if pid in pending:
            pending.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            worst = worst or (128 - code if code < 0 else code)
    return worst


if __name__ == "__main__":
    sys.exit(launch(scenario_mod.Scenario.from_json(sys.argv[1])))
