"""The deferred cache flush, reproduced: one rank reads its deadline later than its peers and gives up a flush
they run, and the grammar cache it kept sends them into the grammar all-gather without it.

`python -m tests.repro.flush SCENARIO_JSON` forks `world` ranks on a real gloo group (as `decode_loop` does:
ledger, catalogue patches, pdfleet's rank instrumentation). Each iteration a rank runs SGLang 0.5.23's
`Scheduler.ingest_requests` (the request broadcast, then `process_input_requests`, which dispatches a
`FlushCacheReqInput` to `SchedulerFlushWrapper.handle` and ends with `SchedulerFlushWrapper.check_pending`), then
decode's `_get_new_prebuilt_batch` (`if has_waiting_grammars(): get_ready_grammar_requests()`, the grammar
queue's `all_gather_object`), then a simulated forward of its running requests, or the idle pause.

The story (iterations from 0), broadcast by rank 0:
- 0: `g-first` (regex `GRAMMAR`) and `plain` (no grammar). `g-first` misses every rank's grammar cache, so it
  waits in the grammar queue until the all-gather says every rank compiled it; both run `DECODE_STEPS` forwards.
- `FLUSH_AT`: `/flush_cache` with `timeout_s=TIMEOUT_S`. Every rank is busy, so each defers it with a deadline
  on its own clock.
- `SLOW_AT`: the last rank spends `SLOW_S` in its own work inside intake (between the broadcast and
  `check_pending`: a GC pause, a preempted process), so it reads its clock `SLOW_S` later than its peers: past
  its deadline while still busy, it gives the flush up. Its peers read theirs in time and keep waiting.
- the next iteration every rank is idle: the peers flush (radix tree, pools, grammar cache), the last rank has
  nothing pending.
- `AGAIN_AT`: `g-again`, the same grammar. Unpatched it is a cache hit on the last rank (admitted at once) and a
  miss on its peers (queued): they enter the grammar all-gather, it goes on to the next broadcast. With
  `flush-consensus` the ranks agree the leader's deadline and their idleness: every rank keeps waiting at
  `SLOW_AT` and flushes at the next iteration, and `g-again` is queued, gathered and admitted alike.

SGLang's own code here: `ingest_requests`, `process_input_requests`, `send_control_output`,
`SchedulerFlushWrapper` (built with its own constructor, wired as `Scheduler.init_running_status` wires it),
`Scheduler.flush_cache`, `Scheduler.is_fully_idle`, `GrammarManager.process_req_with_grammar`,
`get_ready_grammar_requests` and `clear`, `BaseGrammarBackend`'s cache, executor and reset, a real `Req`, and
decode's `_get_new_prebuilt_batch` up to its empty-waiting-queue return. Stand-ins, and why (no model, tokenizer
or KV pools on a CPU): the grammar backend compiles a regex into an empty grammar object (what is under test is
its cache, not the compiler); `handle_generate_request` is its last step only (build the `Req`,
`process_req_with_grammar`, else `_add_request_to_queue`), and `_add_request_to_queue` starts the request's
simulated forwards; the radix tree and pools record that they were reset; the reply channel records replies.

Each rank writes `rank{N}.json`: the iteration each request was admitted at (and whether its grammar was
queued), the iterations this rank flushed at, the flush replies (iteration, success), the patches applied, the
collectives entered.
"""

from __future__ import annotations

import array
import sys
import time
from types import SimpleNamespace
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from tests.repro import decode_loop, health_check, stage
from tests.repro import scenario as scenario_mod

LOOP = phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE
GRAMMAR = "[a-z]+"
DECODE_STEPS = 5  # forwards 0..4: every rank is idle from iteration 5's intake
FLUSH_AT = 2
SLOW_AT = 4
AGAIN_AT = 7
# The deadline and the late read. A peer reads its clock at SLOW_AT about two iterations (0.1 s and the
# broadcasts) after FLUSH_AT, well inside TIMEOUT_S; the last rank reads it SLOW_S later, well past it. SLOW_S stays
# under the verdict's desyncAfter (2 s), so the straggle itself is never judged a Desync.
TIMEOUT_S = 0.8
SLOW_S = 1.2
POLL_S = 1.0
SLOW = "slow"  # the marker rank 0 broadcasts at SLOW_AT; the last rank's handler of it is the late work


def grammar_backend() -> Any:
    """SGLang's `BaseGrammarBackend` (its cache, its compile executor, `reset`), compiling a regex into an empty
    grammar object: what is under test is the cache, not the compiler."""
    from sglang.srt.constrained.base_grammar_backend import BaseGrammarBackend, BaseGrammarObject

    class Compiled(BaseGrammarObject):
        def copy(self) -> Compiled:  # the cache hands out copies
            return Compiled()

    class Backend(BaseGrammarBackend):
        def dispatch_regex(self, key_string: str) -> Compiled:
            return Compiled()

    return Backend()


def grammar_manager(scheduler: Any, group: Any, world: int) -> Any:
    """SGLang's `GrammarManager`, with the attributes its constructor sets for a TP-`world` PP-1 scheduler whose
    dp-TP CPU group is `group` (the constructor itself builds the backend from a tokenizer)."""
    from sglang.srt.constrained.grammar_manager import GrammarManager
    from sglang.srt.environ import envs

    manager = object.__new__(GrammarManager)
    vars(manager).update(
        scheduler=scheduler, server_args=None, grammar_queue=[], grammar_backend=grammar_backend(),
        _enable_strict_thinking=False, grammar_sync_group=group, grammar_sync_size=world,
        grammar_sync_entry=0, is_grammar_sync_entry=scheduler.tp_rank == 0, pp_rank=0, pp_size=1, pp_group=None,
        # SGLang polls a compiling grammar for up to this long before the all-gather (5 ms by default). The
        # stand-in compiles at once, but on a loaded machine its executor thread can miss 5 ms and the request
        # would be admitted an iteration later (on every rank alike); 1 s makes the iteration deterministic.
        grammar_pp_sync_work_list=[], SGLANG_GRAMMAR_POLL_INTERVAL=POLL_S,
        SGLANG_GRAMMAR_MAX_POLL_ITERATIONS=envs.SGLANG_GRAMMAR_MAX_POLL_ITERATIONS.get(),
    )
    return manager


def generate_request(rid: str, regex: str | None) -> Any:
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    return TokenizedGenerateReqInput(
        rid=rid, input_text="", input_ids=array.array("q", [1, 2]), input_embeds=None, mm_inputs=None,
        token_type_ids=None, sampling_params=SamplingParams(max_new_tokens=DECODE_STEPS, regex=regex),
        return_logprob=False, logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None, stream=False,
    )


def inbox(iteration: int) -> list[Any]:
    """What rank 0 broadcasts at `iteration` (the module doc's story)."""
    from sglang.srt.managers.io_struct import FlushCacheReqInput

    return {
        0: [generate_request("g-first", GRAMMAR), generate_request("plain", None)],
        FLUSH_AT: [FlushCacheReqInput(timeout_s=TIMEOUT_S)],
        SLOW_AT: [SLOW],
        AGAIN_AT: [generate_request("g-again", GRAMMAR)],
    }.get(iteration, [])


def run_loop(sc: scenario_mod.Scenario, rank: int, group: Any, rank_writer: seams.Writer) -> dict[str, Any]:
    from sglang.srt.managers.io_struct import FlushCacheReqInput, TokenizedGenerateReqInput
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler_components.flush_wrapper import SchedulerFlushWrapper

    iteration = 0
    receiver = stage.BroadcastReceiver(rank, group, rank_writer, inbox=lambda: inbox(iteration))
    scheduler, _ = stage.build(rank, group, receiver)
    running_batch = health_check._readable_idleness(scheduler, group)
    running: dict[str, int] = {}  # rid -> forwards left
    admitted: dict[str, int] = {}
    queued: dict[str, int] = {}  # requests whose grammar missed this rank's cache
    flushed: list[int] = []
    replies: list[tuple[int, bool]] = []

    def add_to_queue(req: Any, is_retracted: bool = False) -> None:  # where the request starts decoding
        admitted[req.rid] = iteration
        running[req.rid] = DECODE_STEPS

    def handle_generate_request(recv_req: Any) -> None:  # handle_generate_request's last step
        req = Req(recv_req.rid, recv_req.input_text, recv_req.input_ids, recv_req.sampling_params)
        if scheduler.grammar_manager.process_req_with_grammar(req):
            queued[req.rid] = iteration
        else:
            scheduler._add_request_to_queue(req)

    def slow(_: Any) -> None:  # the last rank's own work inside intake; its peers have none
        if rank == sc.world - 1:
            rank_writer.begin(phases.Phase.LOCAL)
            time.sleep(SLOW_S)

    handlers = {TokenizedGenerateReqInput: handle_generate_request, str: slow}
    tp_pool = SimpleNamespace(clear=lambda: None, reset_aux_cache_allocator=lambda: None)
    vars(scheduler).update(
        tp_rank=rank, dp_tp_cpu_group=group, _add_request_to_queue=add_to_queue, draft_worker=None,
        decode_offload_manager=None, enable_hierarchical_cache=False, enable_lmcache=False,
        cur_batch_for_debug=None, req_to_token_pool=tp_pool, token_to_kv_pool_allocator=tp_pool,
        tree_cache=SimpleNamespace(reset=lambda: flushed.append(iteration)),
        enable_priority_scheduling=False,
        metrics_reporter=SimpleNamespace(**vars(scheduler.metrics_reporter), reset_metrics=lambda: None,
                                         is_stats_logging_rank=False),
        ipc_channels=SimpleNamespace(send_to_tokenizer=SimpleNamespace(
            send_output=lambda out, req: replies.append((iteration, bool(out.success))))),
    )
    scheduler.grammar_manager = grammar_manager(scheduler, group, sc.world)
    # As Scheduler.init_running_status builds it, and init_request_dispatcher routes FlushCacheReqInput to it.
    scheduler.flush_wrapper = SchedulerFlushWrapper(flush_cache=scheduler.flush_cache,
                                                    is_fully_idle=scheduler.is_fully_idle,
                                                    send_output=scheduler.send_control_output)
    handlers[FlushCacheReqInput] = scheduler.flush_wrapper.handle
    scheduler._request_dispatcher = lambda req: handlers[type(req)](req)
    rank_writer.set_loop(LOOP)
    for iteration in range(sc.iterations):  # noqa: B007 (the handlers above read it)
        scheduler.ingest_requests()  # SGLang's: the broadcast, the flush wrapper's handle and check_pending
        assert scheduler._get_new_prebuilt_batch(running_batch) is None  # SGLang's grammar gate and gather
        rank_writer.begin(phases.Phase.FORWARD if running else phases.Phase.IDLE)
        time.sleep(sc.forward_s if running else sc.idle_s)
        running = {rid: left - 1 for rid, left in running.items() if left > 1}
        running_batch.reqs = list(running)  # what the next intake's is_fully_idle sees
    return {"rank": rank, "iterations": sc.iterations, "admitted": admitted, "queued": queued,
            "flushed": flushed, "replies": replies}


def rank_main(sc: scenario_mod.Scenario, rank: int) -> None:
    decode_loop.run_story(sc, rank, run_loop)


if __name__ == "__main__":
    sys.exit(decode_loop.launch(scenario_mod.Scenario.from_json(sys.argv[1]), rank_fn=rank_main))
