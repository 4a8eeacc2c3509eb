"""Session reaping, reproduced: a rank that opened a session later than its peers still holds it when they have
reaped it, so a request for it is built there and aborted on its peers, in front of the multimodal broadcast.

`python -m tests.repro.session SCENARIO_JSON` forks `world` ranks on a real gloo group (as `flush` does). Each
iteration a rank runs SGLang 0.5.23's `Scheduler.ingest_requests` (the request broadcast, then
`process_input_requests`, which first calls `SessionController.maybe_reap` with this rank's `time.monotonic()`
and then dispatches the iteration's requests), then a simulated forward or the idle pause.

The story, broadcast by rank 0:
- 0: `SLOW` (the last rank spends `SLOW_S` in its own work inside intake: a GC pause, a preempted process),
  then `OpenSessionReqInput` for session `s` with `timeout=TIMEOUT_S`. Every rank opens it through SGLang's
  `Scheduler.open_session`, each at its own moment: the last rank `SLOW_S` after its peers, so its session's
  `last_active_time` (and deadline) is `SLOW_S` later.
- the iteration after rank 0 no longer holds `s` (its clock passed the deadline and a reap ran): the client's
  next turn, a generate request for `s` carrying multimodal inputs. Each rank runs `_handle_generate_request`'s
  session check (`session_id in self.session_controller and not ...close_on_finish`): built, it goes to SGLang's
  `Scheduler._process_and_broadcast_mm_inputs`, whose `broadcast_object_list` every rank of the group must
  enter; not found, it is aborted.
Unpatched, rank 0 and its near peers reaped `s` on their clocks and abort the request; the last rank, whose
deadline is `SLOW_S` later, builds it and enters the broadcast alone. With `abort-consensus`, only rank 0's clock
decides: the reap rides its next broadcast as a `CloseSessionReqInput`, every rank closes `s` through
`Scheduler.close_session` in the same iteration, and the request is aborted on every rank.

SGLang's own code here: `ingest_requests`, `process_input_requests`, `SessionController` (open, `maybe_reap`,
`Session.is_timed_out`, close), `Scheduler.open_session` and `close_session`, `_process_and_broadcast_mm_inputs`
with `MultimodalInputs.from_processor_output`. Stand-ins, and why (no model, tokenizer or KV pools on a CPU):
`handle_generate_request` is its session check only (the line quoted above), then the broadcast for a built
request; the radix cache is told of a session's release and records nothing; replies are recorded.

Each rank writes `rank{N}.turn` when it handles the turn (built or aborted, and the iteration), before the
broadcast, and at the end `rank{N}.json`: the iteration the request for `s` was built or aborted at, the
iteration this rank stopped holding `s`, the patches applied, the collectives entered.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from tests.repro import decode_loop, stage
from tests.repro import scenario as scenario_mod

LOOP = phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE
SESSION = "s"
# The session's timeout and the last rank's late open. Rank 0 reaps `s` within about a second (maybe_reap's
# interval) after its deadline, and the request follows one iteration later; the last rank's deadline is SLOW_S
# after rank 0's, so it still holds `s` then. SLOW_S stays under the verdict's desyncAfter (2 s), so the
# straggle itself is never judged a Desync.
TIMEOUT_S = 2.5
SLOW_S = 1.5
SLOW = "slow"  # the marker rank 0 broadcasts at 0; the last rank's handler of it is the late work
TURN = "turn-2"


def _controller_release(_: str) -> None:  # the radix cache is told of a session's release (two calls)
    return None


def turn_path(sc: scenario_mod.Scenario, rank: int) -> Path:
    return Path(sc.workdir) / f"rank{rank}.turn"


def run_loop(sc: scenario_mod.Scenario, rank: int, group: Any, rank_writer: seams.Writer) -> dict[str, Any]:
    from sglang.srt.managers.io_struct import (
        CloseSessionReqInput,
        OpenSessionReqInput,
    )
    from sglang.srt.session.session_controller import SessionController

    iteration = 0
    sent: list[int] = []  # rank 0: the iteration it sent the turn at

    def inbox() -> list[Any]:
        if iteration == 0:
            return [SLOW, OpenSessionReqInput(capacity_of_str_len=64, session_id=SESSION, timeout=TIMEOUT_S)]
        if not sent and gone:  # rank 0 no longer holds `s`: the client's next turn arrives now
            sent.append(iteration)
            return [SimpleNamespace(kind=TURN, rid=TURN, session_id=SESSION)]
        return []

    receiver = stage.BroadcastReceiver(rank, group, rank_writer, inbox=inbox)
    scheduler, _ = stage.build(rank, group, receiver)
    built: dict[str, int] = {}
    aborted: dict[str, int] = {}
    gone: list[int] = []  # the iteration this rank stopped holding `s`
    replies: list[Any] = []
    broadcast_results: list[str] = []
    tree_cache = SimpleNamespace(release_radix_session=_controller_release, release_session=_controller_release)

    def marker(what: str) -> None:  # what this rank did with the turn, kept even if the rank dies after
        turn_path(sc, rank).write_text(what)

    def slow(_: Any) -> None:  # the last rank's own work inside intake; its peers have none
        if rank == sc.world - 1:
            rank_writer.begin(phases.Phase.LOCAL)
            time.sleep(SLOW_S)

    def handle_generate_request(recv_req: Any) -> None:
        controller = scheduler.session_controller
        # _handle_generate_request's session branch (SGLang 0.5.23), the condition verbatim.
        if recv_req.session_id in controller and not controller.get(recv_req.session_id).close_on_finish:
            built[recv_req.rid] = iteration
            marker(f"built {recv_req.rid} at {iteration}")  # before the broadcast, which may never return
            rank_writer.collective(phases.Phase.OTHER_COLLECTIVE)
            result = scheduler._process_and_broadcast_mm_inputs(SimpleNamespace(mm_items=[]))  # SGLang's
            rank_writer.begin(phases.Phase.LOCAL)
            broadcast_results.append(type(result).__name__)
        else:
            aborted[recv_req.rid] = iteration
            marker(f"aborted {recv_req.rid} at {iteration}")

    handlers = {OpenSessionReqInput: scheduler.open_session, CloseSessionReqInput: scheduler.close_session,
                SimpleNamespace: handle_generate_request, str: slow}
    vars(scheduler).update(
        tp_rank=rank, dp_tp_cpu_group=group, enable_session_radix_cache=False, tree_cache=tree_cache,
        session_controller=SessionController(tree_cache),
        dp_tp_group=SimpleNamespace(rank_in_group=rank, first_rank=0),
        model_config=SimpleNamespace(requires_mm_token_modalities=False),
        ipc_channels=SimpleNamespace(send_to_tokenizer=SimpleNamespace(
            send_output=lambda out, req: replies.append(type(out).__name__))),
    )
    scheduler._request_dispatcher = lambda req: handlers[type(req)](req)
    rank_writer.set_loop(LOOP)
    opened = False
    for iteration in range(sc.iterations):
        scheduler.ingest_requests()  # SGLang's: the broadcast, maybe_reap, then the requests
        holds = SESSION in scheduler.session_controller
        opened = opened or holds
        if opened and not holds and not gone:
            gone.append(iteration)
        rank_writer.begin(phases.Phase.IDLE)
        time.sleep(sc.idle_s)
    return {"rank": rank, "iterations": sc.iterations, "built": built, "aborted": aborted, "gone": gone,
            "sent": sent, "broadcast_results": broadcast_results}


def rank_main(sc: scenario_mod.Scenario, rank: int) -> None:
    decode_loop.run_story(sc, rank, run_loop)


if __name__ == "__main__":
    sys.exit(decode_loop.launch(scenario_mod.Scenario.from_json(sys.argv[1]), rank_fn=rank_main))
