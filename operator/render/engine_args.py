"""The SGLang command line of one engine process, derived from the spec in one place: `managed_flags`.

Every flag the operator manages (see `pdfleet.operator.api.flags`) is decided here exactly once, in a fixed
order, as (flag, value) pairs; `engine_args` writes them out and the user's `extraArgs` follow unchanged. The
serverArgs gate compares an engine's /server_info with the same pairs (`DesiredGroup.flags`), so what is
checked is what was decided, never a command line read back. Admission already refused extra args that would set a
managed flag, so the result never contains a flag twice: SGLang's argparse would silently let the last one win,
which is how a pool ends up running a TP size or disaggregation mode nobody asked for.

What only the pod renderer knows (this process's node rank, the group leader's rendezvous address, where the
model volume is mounted) comes in as arguments; nothing here reads the cluster or the clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdfleet.operator.api.engine import Switch
from pdfleet.operator.api.roles import PrefillSpec, Role
from pdfleet.operator.api.spec import InferencePoolSpec

DEFAULT_HOST = "0.0.0.0"  # engines serve the router and peers over the pod network

# One managed flag as decided: (flag, value); value None for a flag that means on by being present.
Flag = tuple[str, str | None]


def engine_args(spec: InferencePoolSpec, role: Role, *, node_rank: int = 0, dist_init_addr: str | None = None,
                model_path: str | None = None, host: str = DEFAULT_HOST) -> list[str]:
    """The arguments after `python -m sglang.launch_server` for one pod of a `role` engine group: the managed
    flags (see `managed_flags` for the arguments), then `extraArgs`."""
    flags = managed_flags(spec, role, node_rank=node_rank, dist_init_addr=dist_init_addr, model_path=model_path,
                          host=host)
    return command_line(spec, flags)


def command_line(spec: InferencePoolSpec, flags: Sequence[Flag]) -> list[str]:
    """The managed `flags` written out, then the spec's `extraArgs`."""
    managed = [part for flag, value in flags for part in ((flag,) if value is None else (flag, value))]
    return [*managed, *spec.engine.extra_args]


def managed_flags(
    spec: InferencePoolSpec,
    role: Role,
    *,
    node_rank: int = 0,
    dist_init_addr: str | None = None,
    model_path: str | None = None,
    host: str = DEFAULT_HOST,
) -> tuple[Flag, ...]:
    """The operator-owned flags of one pod of a `role` engine group, in the order they are written.

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
    flags: list[Flag] = [
        ("--model-path", path),
        ("--served-model-name", model.served_name),
        ("--host", host),
        ("--port", str(role_spec.port)),
        ("--disaggregation-mode", str(role)),
        ("--disaggregation-transfer-backend", str(spec.transfer.backend)),
        ("--tp-size", str(role_spec.tp)),
        ("--enable-metrics", None),
    ]
    if isinstance(role_spec, PrefillSpec):
        flags.append(("--disaggregation-bootstrap-port", str(role_spec.bootstrap_port)))
    if spec.transfer.ib_device:
        flags.append(("--disaggregation-ib-device", spec.transfer.ib_device))
    if role_spec.dp > 1:
        flags += [("--dp-size", str(role_spec.dp)), ("--enable-dp-attention", None)]
    if multi_node:
        assert dist_init_addr is not None
        flags += [("--nnodes", str(role_spec.nodes_per_group)), ("--node-rank", str(node_rank)),
                  ("--dist-init-addr", dist_init_addr)]
    if model.tool_call_parser:
        flags.append(("--tool-call-parser", model.tool_call_parser))
    if model.reasoning_parser:
        flags.append(("--reasoning-parser", model.reasoning_parser))
    if model.chat_template:
        flags.append(("--chat-template", model.chat_template))
    if model.trust_remote_code:
        flags.append(("--trust-remote-code", None))
    if spec.engine.overlap_schedule is Switch.DISABLED:
        flags.append(("--disable-overlap-schedule", None))
    if spec.engine.tokenizer_batch_decode is Switch.DISABLED:
        flags.append(("--disable-tokenizer-batch-decode", None))
    return tuple(flags)
