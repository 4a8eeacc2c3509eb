"""The health-check skip of SGLang 0.5.23's intake, reproduced in the decode loop (a scenario with
`health_checks`).

`Scheduler.process_input_requests` drops a health-check generate request on a rank that
`Scheduler.is_fully_idle(for_health_check=True)` calls busy and queues it on an idle one. On a decode rank that
answer reads the retracted queue, which the rank's own allocators fill, so the story is: the last rank alone
holds a retracted request (`retracted`), and rank 0 broadcasts a health check (`health_checks`) while it does.
The loop is the decode loop of `decode_loop` (`ingest_requests`, `process_decode_queue`, batch or idle) through
SGLang's own `ingest_requests`, `process_input_requests`, `is_fully_idle`, `_pp_microbatches_drained`,
`process_decode_queue`, handshake and transfer polls. A queued health check goes where 0.5.23's decode
`_add_request_to_queue` puts a generate request, the prealloc queue; with the fake bootstrap host that
`/health_generate` sets, its handshake completes on the first poll and its KV on the next.

Stand-ins beyond `stage`'s: the request is a real `TokenizedGenerateReqInput` with the fields the HTTP handler
sets, dispatched to the prealloc queue directly (SGLang's `handle_generate_request` builds a `Req` with a
tokenizer and a KV pool, neither of which exists here); the running batch is a real `ScheduleBatch` holding
the requests the loop decodes; dLLM staging, the last batch and the overlap result queue are empty (the
forward is simulated, so no batch result is ever pending).
"""

from __future__ import annotations

import array
import time
from types import SimpleNamespace
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from tests.repro import scenario as scenario_mod
from tests.repro import stage

LOOP = phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE


def request(rid: str) -> Any:
    """What `/health_generate` sends a PD engine, tokenized: one token, one new token, the fake bootstrap host."""
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    return TokenizedGenerateReqInput(
        rid=rid, input_text="", input_ids=array.array("q", [0]), input_embeds=None, mm_inputs=None,
        token_type_ids=None, sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0),
        return_logprob=False, logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None, stream=False,
        bootstrap_host=FAKE_BOOTSTRAP_HOST, bootstrap_room=0,
    )


def _readable_idleness(scheduler: Any, group: Any) -> Any:
    """The attributes `is_fully_idle` reads beyond `stage`'s, and the TP CPU group (`Scheduler.__init__` takes
    it from the TP group; here the one gloo group, as for the broadcast); returns the running batch."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    running_batch = object.__new__(ScheduleBatch)
    running_batch.reqs = []
    vars(scheduler).update(
        running_batch=running_batch, last_batch=None, enable_overlap=False, result_queue=[],
        dllm_manager=SimpleNamespace(any_staging_reqs=lambda: False), _engine_paused=False, tp_cpu_group=group,
    )
    return running_batch


def _route_generate_requests(scheduler: Any) -> None:
    """A generate request goes to the prealloc queue, as `_add_request_to_queue` sends it on a decode rank;
    everything else is dispatched as `stage` does."""
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput

    dispatch = scheduler._request_dispatcher

    def dispatcher(req: Any) -> Any:
        if isinstance(req, TokenizedGenerateReqInput):
            return scheduler.add_transfer((stage.HANDSHAKE, req.rid, 1))
        return dispatch(req)

    scheduler._request_dispatcher = dispatcher


def _forward_or_idle(sc: scenario_mod.Scenario, running: dict[str, int], rank_writer: seams.Writer) -> None:
    """The simulated forward (one decode step of every running request) or the idle pause."""
    rank_writer.begin(phases.Phase.FORWARD if running else phases.Phase.IDLE)
    time.sleep(sc.forward_s if running else sc.idle_s)
    for rid in running:
        running[rid] -= 1


def run_loop(sc: scenario_mod.Scenario, rank: int, group: Any, rank_writer: seams.Writer) -> dict[str, Any]:
    """The decode loop for `sc.iterations` iterations; returns, per health check, the iteration at which this
    rank skipped it (SGLang noted its reply IPC), queued it, failed it (a KV poll retired it), had its KV, and
    finished it."""
    from sglang.srt.managers.scheduler import Scheduler

    iteration = 0

    def inbox() -> list[Any]:
        return [request(rid) for rid in sc.health_checks.get(iteration, [])]

    receiver = stage.BroadcastReceiver(rank, group, rank_writer, inbox=inbox)
    scheduler, transfer_queue = stage.build(rank, group, receiver)
    running_batch = _readable_idleness(scheduler, group)
    _route_generate_requests(scheduler)
    prealloc = scheduler.disagg_decode_prealloc_queue
    running: dict[str, int] = {}  # rid -> forwards left
    events: dict[str, dict[str, int]] = {"skipped": {}, "queued": {}, "failed": {}, "transferred": {}, "finished": {}}
    rank_writer.set_loop(LOOP)
    for iteration in range(sc.iterations):
        skipped_before = len(scheduler.return_health_check_ipcs)
        scheduler.ingest_requests()  # the broadcast, then process_input_requests: the branch under test
        arrived = sc.health_checks.get(iteration, [])
        skipped = len(scheduler.return_health_check_ipcs) - skipped_before
        for rid in arrived:
            events["skipped" if rid not in {d.req.rid for d in prealloc.queue} else "queued"][rid] = iteration
        assert skipped == sum(rid in events["skipped"] for rid in arrived)
        # This rank's own memory retracted a request, or resumed it (only this rank sees its allocators).
        prealloc.retracted_queue = [f"retracted-on-{rank}"] if sc.holds_retracted(rank, iteration) else []
        scheduler.process_decode_queue()  # SGLang: retraction gate, handshake poll, pop_transferred
        rank_writer.begin(phases.Phase.LOCAL)
        running.update(dict.fromkeys((req.rid for req in scheduler.waiting_queue), sc.decode_steps))
        events["transferred"].update(dict.fromkeys((req.rid for req in scheduler.waiting_queue), iteration))
        scheduler.waiting_queue.clear()
        held = {d.req.rid for d in [*prealloc.queue, *transfer_queue.queue]} | set(events["transferred"])
        for rid in set(events["queued"]) - held - set(events["failed"]):  # SGLang failed it (a KV poll said so)
            events["failed"][rid] = iteration
        _forward_or_idle(sc, running, rank_writer)
        events["finished"].update({rid: iteration for rid, left in running.items() if left == 0})
        running = {rid: left for rid, left in running.items() if left > 0}
        running_batch.reqs = list(running)  # what the next intake's is_fully_idle sees
    agreeing = getattr(Scheduler.is_fully_idle, "__pdfleet_patch__", None)
    return {"rank": rank, "iterations": sc.iterations, "is_fully_idle_patched_by": agreeing, **events}
