"""The collectives and process-group operations a scan stops at: torch.distributed's and SGLang's own.

A call is a primitive when it resolves to one of `TORCH` under `torch.distributed`; to a method of SGLang's
`GroupCoordinator` named in `GROUP_COORDINATOR` (kept equal to the source by
tests/unit/test_desync_scan.py); to a method named in `COMMUNICATOR_METHODS` of any class under
`sglang.srt.distributed` (pynccl, custom all-reduce and the other device communicators the coordinator
wraps); to one of SGLang's group-creation helpers (`GROUP_HELPERS`); or, when the receiver's class cannot be
inferred, to a method whose name is one of `BY_NAME` (reported as `?.name`, so an unknown receiver errs
towards a row, not a miss).
"""

from __future__ import annotations

TORCH = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_object", "all_gather_into_tensor",
    "_all_gather_base", "all_gather_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "_reduce_scatter_base", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list",
    "gather", "gather_object", "scatter", "scatter_object_list", "barrier", "monitored_barrier", "send", "recv",
    "isend", "irecv", "send_object_list", "recv_object_list", "batch_isend_irecv", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration", "init_process_group", "destroy_process_group",
})

# GroupCoordinator's public methods that enter a collective, a point-to-point transfer or destroy groups.
GROUP_COORDINATOR = frozenset({
    "all_reduce", "quant_all_reduce", "fused_allreduce_rmsnorm", "fused_allreduce_rmsnorm_quant_per_group",
    "reduce_scatter_along_dim", "reduce_scatter_tensor", "reduce_scatter", "reduce_scatterv", "all_to_all_single",
    "all_gather_into_tensor", "all_gather", "all_gatherv", "gather", "broadcast", "broadcast_object",
    "broadcast_object_list", "all_gather_object", "send_object", "recv_object", "broadcast_tensor_dict",
    "send_tensor_dict", "recv_tensor_dict", "send_recv_tensor_dict", "barrier", "send", "recv", "destroy",
})

COMMUNICATOR_METHODS = GROUP_COORDINATOR | {"all_reduce_unreg", "custom_all_reduce", "reduce_scatter_v"}

# sglang.srt.distributed.parallel_state's helpers that create or destroy process groups (each builds
# GroupCoordinators, whose constructor calls torch.distributed.new_group), and utils' custom group.
GROUP_HELPERS = frozenset({
    "sglang.srt.distributed.parallel_state.GroupCoordinator",
    "sglang.srt.distributed.parallel_state.init_world_group",
    "sglang.srt.distributed.parallel_state.init_model_parallel_group",
    "sglang.srt.distributed.parallel_state.init_distributed_environment",
    "sglang.srt.distributed.parallel_state.initialize_model_parallel",
    "sglang.srt.distributed.parallel_state.create_custom_parallel_group",
    "sglang.srt.distributed.parallel_state.destroy_model_parallel",
    "sglang.srt.distributed.parallel_state.destroy_distributed_environment",
    "sglang.srt.distributed.parallel_state.in_the_same_node_as",
    "sglang.srt.utils.common.init_custom_process_group",
})

# Names that, called on a receiver of unknown class, are taken for a collective. Left out because they are
# common on non-collective objects (zmq sockets, tensors, queues): send, recv, gather, scatter, reduce.
BY_NAME = frozenset({
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast_object", "broadcast_object_list", "send_object", "recv_object",
    "isend", "irecv", "batch_isend_irecv", "barrier", "monitored_barrier", "new_group", "all_to_all_single",
    "broadcast_tensor_dict", "send_tensor_dict", "recv_tensor_dict", "send_object_list", "recv_object_list",
})

GROUP_COORDINATOR_CLASS = "sglang.srt.distributed.parallel_state.GroupCoordinator"
DISTRIBUTED_PACKAGE = "sglang.srt.distributed."


def torch_primitive(dotted: str) -> str | None:
    """`torch.distributed.all_reduce` (also through distributed_c10d) -> its short name, else None."""
    for prefix in ("torch.distributed.distributed_c10d.", "torch.distributed."):
        if dotted.startswith(prefix) and (name := dotted[len(prefix):]) in TORCH:
            return name
    return None
