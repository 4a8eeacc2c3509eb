"""A rank's ledger slot follows SGLang's own layout of ranks over nodes: every scheduler process of a pod
gets its own slot, and the pod's slots are exactly the ranks it runs."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdfleet.runtime.instrument.placement import Placement, place


def test_single_node_tp_uses_the_tp_rank_as_slot() -> None:
    assert [place(tp_rank=r, tp_size=4) for r in range(4)] == [Placement(r, r, 4) for r in range(4)]


def test_multi_node_tp_numbers_slots_within_each_pod_and_keeps_the_global_rank() -> None:
    assert place(tp_rank=13, tp_size=16, nnodes=2) == Placement(slot=5, rank=13, slots=8)


def test_pipeline_stages_on_separate_nodes_each_fill_their_pod() -> None:
    assert place(tp_rank=3, tp_size=4, pp_rank=1, pp_size=2, nnodes=2) == Placement(slot=3, rank=3, slots=4)


def test_plain_data_parallel_replicas_share_the_pod_ledger_one_block_each() -> None:
    assert place(tp_rank=1, tp_size=2, dp_replica=1, dp_replicas=2) == Placement(slot=3, rank=1, slots=4)


def test_a_rank_outside_its_group_is_refused() -> None:
    with pytest.raises(ValueError, match="not a rank layout"):
        place(tp_rank=4, tp_size=4)


@given(tp=st.sampled_from([1, 2, 4, 8, 16]), pp=st.sampled_from([1, 2, 4]), nnodes=st.sampled_from([1, 2, 4]),
       dp=st.sampled_from([1, 2]))
def test_the_ranks_of_one_node_fill_its_slots_exactly_once(tp: int, pp: int, nnodes: int, dp: int) -> None:
    """Mirrors `DataParallelController.launch_tensor_parallel_group` (0.5.23): which (pp, tp) ranks a node runs."""
    pp_per_node = max(pp // nnodes, 1)
    nodes_per_tp_group = max(nnodes // pp, 1)
    if tp % nodes_per_tp_group:
        return
    tp_per_node = tp // nodes_per_tp_group
    for node in range(nnodes):
        pp_ranks = range(pp_per_node * (node // nodes_per_tp_group), pp_per_node * (node // nodes_per_tp_group + 1))
        tp_ranks = range(tp_per_node * (node % nodes_per_tp_group), tp_per_node * (node % nodes_per_tp_group + 1))
        placed = [place(tp_rank=t, tp_size=tp, pp_rank=p, pp_size=pp, nnodes=nnodes, dp_replica=d, dp_replicas=dp)
                  for d, p, t in itertools.product(range(dp), pp_ranks, tp_ranks)]
        assert sorted(x.slot for x in placed) == list(range(placed[0].slots))
