"""The SGLang command line of one engine process, derived from the spec: one pure function, `engine_args`.

Every flag the operator manages (see `pdfleet.operator.api.flags`) is written here exactly once, in a fixed
order, and the user's `extraArgs` follow unchanged. Admission already refused extra args that would set a
managed flag, so the result never contains a flag twice: SGLang's argparse would silently let the last one win,
which is how a pool ends up running a TP size or disaggregation mode nobody asked for.

What only the pod renderer knows (this process's node rank, the group leader's rendezvous address, where the
model volume is mounted) comes in as arguments; nothing here reads the cluster or the clock.
"""

from __future__ import annotations

from pdfleet.operator.api.engine import Switch
from pdfleet.operator.api.roles import PrefillSpec, Role
from pdfleet.operator.api.spec import InferencePoolSpec

DEFAULT_HOST = "0.0.0.0"  # engines serve the router and peers over the pod network


def engine_args(
    spec: InferencePoolSpec,
    role: Role,
    *,
    node_rank: int = 0,
    dist_init_addr: str | None = None,
    model_path: str | None = None,
    host: str = DEFAULT_HOST,
) -> list[str]:
    """The arguments after `python -m sglang.launch_server` for one pod of a `role` engine group.

    `model_path` is where the pod renderer mounted a pvc/hostPath model; for a `path` source it may be None
    and the spec's path is used. `dist_init_addr` (host:port of node rank 0) is required, and only accepted,
    for multi-node groups.
    """
    role_spec = spec.role(role)
    path = model_path if model_path is not None else spec.model.source.path
    if path is None:
        raise ValueError("model.source is a volume: pass model_path, where the pod mounts it")
    multi_node = role_spec.nodes_per_group > 1
    if not 0 <= node_rank < role_spec.nodes_per_group:
        raise ValueError(f"node_rank {node_rank} is outside 0..{role_spec.nodes_per_group - 1}")
    if multi_node != (dist_init_addr is not None):
        raise ValueError("dist_init_addr is required for multi-node groups and only for them")

    model = spec.model
    args = [
        "--model-path", path,
        "--served-model-name", model.served_name,
        "--host", host,
        "--port", str(role_spec.port),
        "--disaggregation-mode", str(role),
        "--disaggregation-transfer-backend", str(spec.transfer.backend),
        "--tp-size", str(role_spec.tp),
        "--enable-metrics",
    ]
    if isinstance(role_spec, PrefillSpec):
        args += ["--disaggregation-bootstrap-port", str(role_spec.bootstrap_port)]
    if spec.transfer.ib_device:
        args += ["--disaggregation-ib-device", spec.transfer.ib_device]
    if role_spec.dp > 1:
        args += ["--dp-size", str(role_spec.dp), "--enable-dp-attention"]
    if multi_node:
        assert dist_init_addr is not None
        args += ["--nnodes", str(role_spec.nodes_per_group), "--node-rank", str(node_rank),
                 "--dist-init-addr", dist_init_addr]
    if model.tool_call_parser:
        args += ["--tool-call-parser", model.tool_call_parser]
    if model.reasoning_parser:
        args += ["--reasoning-parser", model.reasoning_parser]
    if model.chat_template:
        args += ["--chat-template", model.chat_template]
    if model.trust_remote_code:
        args.append("--trust-remote-code")
    if spec.engine.overlap_schedule is Switch.DISABLED:
        args.append("--disable-overlap-schedule")
    if spec.engine.tokenizer_batch_decode is Switch.DISABLED:
        args.append("--disable-tokenizer-batch-decode")
    return [*args, *spec.engine.extra_args]
