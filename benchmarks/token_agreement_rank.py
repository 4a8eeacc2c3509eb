"""One rank of benchmarks/bench_token_agreement.py.

    python benchmarks/token_agreement_rank.py RANK WORLD PORT CALLS OUT BATCHES

Started with SYNC_TOKEN_IDS_ACROSS_TP=1, on a gloo group on 127.0.0.1:PORT. Rank 0 writes every block's per-call
times (nanoseconds) to OUT as JSON, by batch size (BATCHES: comma-separated).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist


def main() -> None:
    rank, world, port, calls = (int(a) for a in sys.argv[1:5])
    out, batches = Path(sys.argv[5]), [int(b) for b in sys.argv[6].split(",")]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from sglang.srt.layers import sampler
    from sglang.srt.utils.common import broadcast_pyobj

    if not sampler.SYNC_TOKEN_IDS_ACROSS_TP:
        raise SystemExit("started without SYNC_TOKEN_IDS_ACROSS_TP=1: SGLang's sampler would not sync")
    group = dist.group.WORLD
    owner = SimpleNamespace(tp_sync_group=group, cp_sync_group=None)
    info = SimpleNamespace(grammars=None)

    def broadcast() -> None:  # what recv_requests does every iteration with no new request
        broadcast_pyobj([], rank, group, src=0)

    def agreement(batch: int) -> Callable[[], None]:
        tokens = torch.randint(0, 32000, (batch,), dtype=torch.int64)  # each rank its own
        sampler.Sampler._sync_token_ids_across_tp(owner, tokens, info)
        seen = [torch.empty_like(tokens) for _ in range(world)]
        dist.all_gather(seen, tokens, group=group)
        if not all(torch.equal(s, tokens) for s in seen):
            raise SystemExit("the ranks do not agree on the tokens after SGLang's sync")
        return lambda: sampler.Sampler._sync_token_ids_across_tp(owner, tokens, info)

    def block(step: Callable[[], None]) -> list[int]:
        dist.barrier(group)
        times = []
        for _ in range(calls):
            start = time.perf_counter_ns()
            step()
            times.append(time.perf_counter_ns() - start)
        return times

    report = {}
    for batch in batches:
        sync = agreement(batch)
        base, agreed = block(broadcast), block(sync)
        agreed += block(sync)
        base += block(broadcast)
        report[batch] = {"broadcast": base, "agreement": agreed}
    if rank == 0:
        out.write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
