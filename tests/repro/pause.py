"""`pause_generation(mode="retract")` on decode ranks whose running batches differ: every rank still enters the
decode offload manager's all-reduces once, together.

`python -m tests.repro.pause SCENARIO_JSON` forks `world` ranks on a real gloo group (as `decode_loop` does). Each
builds a decode scheduler with SGLang's own `DecodeKVCacheOffloadManager` (decode KV offload on; its all-reduces
over the group) and runs SGLang 0.5.23's own `Scheduler.pause_generation` with a retract-mode
`PauseGenerationReqInput`, the request every rank receives in the same broadcast. The ranks' own state differs as
far as it can: rank 0 runs `RUNNING` decoding requests, the last rank runs none and holds one transferred request
in its waiting queue, any other rank holds nothing. What decides whether the offload manager's
`drain_before_retraction` (its `check_offload_progress` MIN, then its own MAX) runs is the request's mode and
whether decode offload is configured, not the rank's requests: every rank enters both all-reduces exactly once
and returns, having retracted what it held.

Stand-ins, and why (no KV pools on a CPU): `retract_all` records the requests it is given (its release of each
request's KV goes through the radix cache: the HiCache row of docs/desync-audit.md, settled, and FlexKV's,
refused); the requests are the fields `pause_generation` reads; metrics and KV events are no-ops.
`torch.distributed.all_reduce` is counted on its way to gloo.

Each rank writes `rank{N}.json`: how many all-reduces it entered, the requests retracted and held for rebootstrap.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

from tests.repro import decode_loop, retraction, stage
from tests.repro import scenario as scenario_mod

RUNNING = 2


def _request(rid: str, holds_kv: bool = True) -> Any:
    return SimpleNamespace(rid=rid, finished=lambda: False, output_ids=[7], kv=SimpleNamespace(holds_kv=holds_kv),
                           time_stats=SimpleNamespace(set_retract_time=lambda: None))


def run(sc: scenario_mod.Scenario, rank: int, group: Any) -> dict[str, Any]:
    import torch.distributed as dist
    from sglang.srt.managers import scheduler as scheduler_module
    from sglang.srt.managers.io_struct import PauseGenerationReqInput
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    retracted: list[str] = []
    scheduler_module.retract_all = lambda *, reqs, **_: retracted.extend(r.rid for r in reqs)  # type: ignore[attr-defined]
    reduced = [0]
    all_reduce = dist.all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        reduced[0] += 1
        return all_reduce(*args, **kwargs)

    dist.all_reduce = counted  # the offload manager calls torch.distributed.all_reduce by attribute

    scheduler, _ = stage.build(rank, group, receiver=None)  # no intake here: the request is handed over
    running_batch = object.__new__(ScheduleBatch)
    vars(running_batch).update(reqs=[_request(f"run-{i}") for i in range(RUNNING)] if rank == 0 else [],
                               batch_is_full=True)
    waiting = [_request("staged")] if rank == sc.world - 1 and rank != 0 else []
    prealloc = scheduler.disagg_decode_prealloc_queue
    prealloc.held_rebootstrap_reqs = []
    vars(scheduler).update(
        _engine_paused=False, enable_overlap=False, last_batch=None, enable_overlap_mlx=False,
        _pause_started_at=None, running_batch=running_batch, chunked_req=None, waiting_queue=waiting,
        cur_batch_for_debug=None, decode_offload_manager=retraction._offload_manager(group),
        req_to_token_pool=None, token_to_kv_pool_allocator=None, tree_cache=None, hisparse_coordinator=None,
        metrics_reporter=SimpleNamespace(last_gen_throughput=1.0, current_scheduler_metrics_enabled=False),
        kv_events_publisher=SimpleNamespace(publish_kv_events=lambda: None),
    )
    scheduler.pause_generation(PauseGenerationReqInput(mode="retract"))  # SGLang's own
    return {"rank": rank, "all_reduces": reduced[0], "retracted": retracted,
            "held": [r.rid for r in prealloc.held_rebootstrap_reqs], "paused": scheduler._engine_paused}


def rank_main(sc: scenario_mod.Scenario, rank: int) -> None:
    import torch.distributed as dist

    decode_loop.join(sc, rank).close()
    result = run(sc, rank, dist.group.WORLD)
    sc.result_path(rank).write_text(json.dumps(result))


if __name__ == "__main__":
    sys.exit(decode_loop.launch(scenario_mod.Scenario.from_json(sys.argv[1]), rank_fn=rank_main))
