"""A HiCache storage attach, dispatched from the broadcast, on ranks of which one is busy.

`python -m tests.repro.hicache_attach SCENARIO_JSON` forks `world` ranks on a real gloo group (as `decode_loop`
does). Each runs SGLang 0.5.23's own `Scheduler.attach_hicache_storage_wrapped` for the same
`AttachHiCacheStorageReqInput`, then the next request broadcast (SGLang's own `broadcast_pyobj` from rank 0).
A rank holding a retracted request at iteration 0 (`sc.retracted`, its own memory decided so) is not fully idle;
SGLang's handler refuses the attach there. On the other ranks the tree cache's attach creates the storage sync
groups with SGLang's own `HiCacheController._create_sync_groups` (one `create_custom_parallel_group` over the TP
ranks: a world all-gather of each rank's group, then `new_group`), as the controller's `attach_storage_backend`
does after building the back-end.

Stand-ins, and why: the scheduler is the fields the handler reads (idleness is the rank's answer above); the tree
cache's attach runs only the group creation (no storage back-end is built on a CPU); SGLang's config reads
(`get_serving`, `get_context`) answer the served model's name and accept the handler's override.

What a busy rank does to its peers: it answers "not idle" and enters the next broadcast, they wait in the group
creation's all-gather for it until gloo's timeout (`sc.gloo_timeout_s`), SGLang's handler catches that timeout as
a failed attach, and the group's connections are closed: no rank completes the next broadcast.

Each rank rewrites `rank{N}.json` after every step: whether it attached (SGLang's answer and how long the handler
took), the broadcast it received, its step.
"""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace
from typing import Any

from tests.repro import decode_loop, steps
from tests.repro import scenario as scenario_mod

NEXT_REQUESTS = ["req-after-attach"]


def run(sc: scenario_mod.Scenario, rank: int, group: Any) -> None:
    from sglang.srt.managers import scheduler as scheduler_module
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.managers.io_struct import AttachHiCacheStorageReqInput
    from sglang.srt.utils import broadcast_pyobj

    record: dict[str, Any] = {"rank": rank, "in": "attach"}

    def save() -> None:
        steps.save(sc, rank, record)

    def attach_storage_backend(**_: Any) -> tuple[bool, str]:
        controller = SimpleNamespace(attn_cp_group=None, attn_tp_group=None, tp_group=group, pp_group=None)
        groups = HiCacheController._create_sync_groups(controller)
        return True, f"attached with {len(groups)} sync group(s)"

    scheduler_module.get_serving = lambda: SimpleNamespace(served_model_name="tiny")
    scheduler_module.get_context = lambda: SimpleNamespace(override=lambda *args, **kwargs: None)
    busy = sc.holds_retracted(rank, 0)
    scheduler = SimpleNamespace(
        enable_hierarchical_cache=True, is_fully_idle=lambda: not busy, waiting_queue=[],
        running_batch=SimpleNamespace(reqs=[]), enable_hicache_storage=False,
        tree_cache=SimpleNamespace(attach_storage_backend=attach_storage_backend))
    save()
    started = time.monotonic()
    answer = scheduler_module.Scheduler.attach_hicache_storage_wrapped(
        scheduler, AttachHiCacheStorageReqInput(hicache_storage_backend="file"))
    record.update(attached=answer.success, message=answer.message, busy=busy, attach_s=time.monotonic() - started)
    record["in"] = "broadcast"
    save()
    record["received"] = broadcast_pyobj(NEXT_REQUESTS if rank == 0 else [], rank, group, src=0)
    record["in"] = "done"
    save()


rank_main = steps.rank_main(run)


if __name__ == "__main__":
    sys.exit(decode_loop.launch(scenario_mod.Scenario.from_json(sys.argv[1]), rank_fn=rank_main))
