"""The one reduction the consensus patches agree with: a MIN all-reduce of a few integers over a gloo CPU group.

A rank's "yes" is 1 and "no" is 0, so the MIN is "every rank said yes"; a capacity's MIN is the group's smallest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def all_min(values: Sequence[int], group: Any) -> list[int]:
    """The element-wise MIN of `values` over `group`; every rank of the group must call it with as many values.
    A group of one rank enters no collective."""
    import torch
    import torch.distributed as dist

    if dist.get_world_size(group) == 1:
        return [int(v) for v in values]
    tensor = torch.tensor(list(values), dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group)
    return [int(v) for v in tensor.tolist()]
