"""FlexKV's TP fan-out (`FlexKVComm.scatter`) when one rank makes a call its peers do not.

`python -m tests.repro.flexkv SCENARIO_JSON` forks `world` ranks on a real gloo group (as `decode_loop` does), each
an attention-TP rank of one FlexKV radix cache, PP and CP 1, with SGLang 0.5.23's own `FlexKVComm` over that group:
the sync leader (rank 0) sends its answer to every TP rank by non-blocking isends, a follower receives the next
message with the TP tag, whatever call it is in. Three steps, the payloads as `FlexKVConnector` builds them:

1. a prefix lookup (`lookup_kv`: the leader's FlexKV task id and hit), every rank;
2. a load-back that needs `LOAD_BACK` free KV tokens: a rank short of them evicts first, and `evict` drains the
   store completions (`check_completed_stores`: the leader's list of completed handles) through the same fan-out.
   A rank's free KV is `sc.kv_free` (`scenario.KV_FREE` unless said); the test of the branch is
   `FlexKVRadixCache._allocate_and_load`'s own (`available_size() < uncached_len`, pinned by
   tests/unit/test_desync_refused_rows.py);
3. the next request's lookup, every rank.

Stand-ins, and why: FlexKV's `KVManager` (an external package) is not built; its answers are the leader's payloads
below. The leader waits for its sends to be delivered before it exits, so a follower's receive is answered by what
the leader sent, not cut by the leader's exit.

Each rank rewrites `rank{N}.json` after every step: what each scatter returned, and the step it is in.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

from tests.repro import decode_loop, steps
from tests.repro import scenario as scenario_mod

LOAD_BACK = 1000  # tokens the load-back of step 2 allocates
FIRST_LOOKUP = {"task_id": 7, "hit": 64}
COMPLETED: list[int] = [3]  # the leader's completed store handles
NEXT_LOOKUP = {"task_id": 8, "hit": 128}


def comm(rank: int, world: int, group: Any) -> Any:
    from sglang.srt.mem_cache.storage.flexkv import flexkv_comm

    # FlexKVComm sends on the world CPU group it asks SGLang's parallel state for: here, the gloo group.
    flexkv_comm.get_parallel = lambda: SimpleNamespace(world_group=SimpleNamespace(cpu_group=group))
    model_config = SimpleNamespace(pp_size=1, attn_tp_size=world, attn_cp_size=1)
    rank_info = SimpleNamespace(model_config=model_config, pp_rank=0, attn_tp_rank=rank, attn_cp_rank=0,
                                pp_size_per_node=1)
    return flexkv_comm.FlexKVComm(rank_info, world_rank=rank, attn_tp_group=group)


def run(sc: scenario_mod.Scenario, rank: int, group: Any) -> None:
    sync = comm(rank, sc.world, group)
    leader = sync.is_sync_leader
    record: dict[str, Any] = {"rank": rank, "evicted": False, "in": "lookup"}

    def save() -> None:
        steps.save(sc, rank, record)

    save()
    record["lookup"] = sync.scatter(FIRST_LOOKUP if leader else {"task_id": -1, "hit": 0})
    if sc.kv_free.get(rank, scenario_mod.KV_FREE) < LOAD_BACK:
        record.update({"evicted": True, "in": "store_drain"})
        save()
        record["drained"] = sync.scatter(COMPLETED if leader else [])
    record["in"] = "next_lookup"
    save()
    record["next_lookup"] = sync.scatter(NEXT_LOOKUP if leader else {"task_id": -1, "hit": 0})
    if leader:
        for work in sync._async_works:
            work.wait()
    record["in"] = "done"
    save()


rank_main = steps.rank_main(run)


if __name__ == "__main__":
    sys.exit(decode_loop.launch(scenario_mod.Scenario.from_json(sys.argv[1]), rank_fn=rank_main))
