"""Which ledger slot a scheduler rank writes: pure arithmetic on SGLang's rank layout, no I/O.

A pod's ledger has one slot per scheduler process of that pod. SGLang lays ranks out over nodes as its
`DataParallelController.launch_tensor_parallel_group` does (0.5.23): pipeline stages are split over nodes
first, then each stage's TP ranks over the nodes that share that stage. Plain data parallelism (`--dp-size`
without DP attention) runs `dp_size` independent engines in the pod, one after the other on the GPUs.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Placement:
    """`slot` in a ledger of `slots` slots, written by the rank that SGLang calls `rank` (its TP rank)."""

    slot: int
    rank: int
    slots: int


def place(*, tp_rank: int, tp_size: int, pp_rank: int = 0, pp_size: int = 1, nnodes: int = 1,
          dp_replica: int = 0, dp_replicas: int = 1) -> Placement:
    """The slot of one rank in its pod's ledger. Raises ValueError for a layout SGLang would refuse."""
    if not (0 <= tp_rank < tp_size and 0 <= pp_rank < pp_size and 0 <= dp_replica < dp_replicas and nnodes >= 1):
        raise ValueError(f"not a rank layout: tp {tp_rank}/{tp_size}, pp {pp_rank}/{pp_size}, "
                         f"dp {dp_replica}/{dp_replicas}, nnodes {nnodes}")
    pp_per_node = max(pp_size // nnodes, 1)
    nodes_per_tp_group = max(nnodes // pp_size, 1)
    if tp_size % nodes_per_tp_group:
        raise ValueError(f"tp_size {tp_size} does not split over {nodes_per_tp_group} nodes")
    tp_per_node = tp_size // nodes_per_tp_group
    per_engine = pp_per_node * tp_per_node
    slot = dp_replica * per_engine + (pp_rank % pp_per_node) * tp_per_node + tp_rank % tp_per_node
    return Placement(slot=slot, rank=tp_rank, slots=per_engine * dp_replicas)
