"""Prefill admission alone, for tests.repro.overhead's `admitting` workload: SGLang's own
`Scheduler.get_new_batch_prefill` on every rank, nothing diverging.

Each iteration builds a fresh prefill scheduler with SGLang's real admission (`prefill.build` with `kv_free`:
tests/repro/prefill_admission.py's `PrefillAdder`, `PrefillBudget` and `SchedulePolicy` over a real `RadixCache`,
paged allocator and request slots), puts `WAITING` SGLang `Req`s in its waiting queue, room for all of them on
every rank, and times the one `get_new_batch_prefill` call: the call admission-consensus agrees (one all-reduce of
its capacity vector over attention TP, then attention CP). Building the scheduler and the requests stays outside
the timing: a real scheduler keeps its pools, only the call repeats every prefill iteration.
"""

from __future__ import annotations

import time
from typing import Any

from pdfleet.runtime.health import phases
from tests.repro import prefill, prefill_admission, stage
from tests.repro import scenario as scenario_mod

WAITING = 3  # prompts of prefill_admission.PROMPT tokens: a third of scenario.KV_FREE with their reserved decode


def _waiting(iteration: int) -> list[Any]:
    def unused(_: stage.SlowReceiver) -> None:  # no transfer starts: admission never aborts one
        return None

    rids = [f"admit-{iteration}-{i}" for i in range(WAITING)]
    return [prefill_admission.real_request(rid, vars(prefill.new_request(rid, stage.SlowReceiver(1, unused))))
            for rid in rids]


def run_loop(sc: scenario_mod.Scenario, rank: int, group: Any, rank_writer: Any) -> dict[str, Any]:
    """`sc.iterations` admissions, each from a fresh scheduler; each call's time and the rids it batched."""
    import torch.distributed as dist
    from sglang.srt.managers import scheduler as scheduler_module

    cp_group = prefill.singleton_groups(rank, sc.world)  # every rank creates every group: once per block
    receiver = stage.BroadcastReceiver(rank, group, rank_writer, inbox=list)  # admission receives nothing
    # equip() swaps the batch class SGLang's scheduler builds for one bound to the new pools; it must subclass
    # SGLang's own each time, not the previous iteration's, and the prefill workloads get SGLang's own back.
    shipped = scheduler_module.ScheduleBatch, scheduler_module.PrefillStats
    rank_writer.set_loop(prefill.LOOP)
    iteration_ns: list[int] = []
    admitted: list[list[str]] = []
    try:
        for iteration in range(sc.iterations):
            scheduler_module.ScheduleBatch, scheduler_module.PrefillStats = shipped
            scheduler = prefill.build(rank, group, cp_group, receiver, kv_free=scenario_mod.KV_FREE)
            scheduler.waiting_queue = _waiting(iteration)
            running_batch = prefill_admission.running_batch()
            # The ranks reach the call together, as a real loop's do after its previous collective: the skew of
            # the untimed rebuild above stays out of the figure (a barrier no ledger records).
            dist.barrier(group)
            rank_writer.step()
            started_ns = time.perf_counter_ns()
            plan = scheduler.get_new_batch_prefill(running_batch)  # SGLang's, patched or not
            iteration_ns.append(time.perf_counter_ns() - started_ns)
            rank_writer.begin(phases.Phase.LOCAL)
            batch = plan.batch_to_run
            admitted.append([req.rid for req in batch.reqs] if batch is not None else [])
            if scheduler.waiting_queue or scheduler.chunked_req is not None:
                raise RuntimeError(f"rank {rank}: admission left {[r.rid for r in scheduler.waiting_queue]} waiting"
                                   f" and chunked {scheduler.chunked_req}: the workload must fit")
    finally:
        scheduler_module.ScheduleBatch, scheduler_module.PrefillStats = shipped
    return {"rank": rank, "iterations": sc.iterations, "iteration_ns": iteration_ns, "admitted": admitted}
