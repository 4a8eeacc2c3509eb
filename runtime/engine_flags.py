"""SGLang flags the operator owns: it derives them from typed fields, so `extraArgs` may not set them, and neither may
an SGLang config file (`--config`), which the engine launcher resolves and checks against this same table.

Each flag maps to the spec field that owns it (or the reason it is refused), so a refusal can say what to set
instead. Aliases are listed too (`--tp` and `--tensor-parallel-size` both set tp_size). SGLang builds its
parser with argparse's default `allow_abbrev=True`, so any unambiguous prefix of a flag also sets it
(`--disaggregation-mo decode`): an extra arg is refused when its option name is a prefix of a managed flag,
not only when it equals one. The CEL rule in the operator's `api/engine.py` and `reserved_flag` below implement
that one test.

`FLAGS` is the one table of them: who owns each, and how /server_info shows it to the serverArgs gate. Plain data,
standard library only: the operator (admission, rendering, the gates; `pdfleet.operator.api.flags`) and the
launcher inside an engine image both read it.
"""

from __future__ import annotations

import dataclasses
from typing import Final


@dataclasses.dataclass(frozen=True)
class ManagedFlag:
    """One flag the operator owns. `field`/`kind`: the ServerArgs field SGLang's /server_info reports it as and
    its type there (`bool`: a store_true flag), which the serverArgs gate compares; `unchecked`: why the gate
    does not compare it, for the others. `switch`: owned through a Switch, so its absence is rendered on purpose
    and the engine must show it off too."""

    owner: str  # the spec field that sets it, or why nobody may
    field: str | None = None
    kind: type = str
    unchecked: str | None = None
    switch: bool = False


ALIAS = "an alias the renderer never writes"
NO_PP = "refused: pipeline parallelism is not supported"
# SGLang's PD role switch decides per rank (idle, free-memory headroom, caught exceptions) and re-dispatches the
# other role's event loop with no agreement across the TP group: a rank that switches alone hangs the group
# (docs/desync-audit.md). pdfleet never renders it and refuses it in extraArgs; a role is the pool's to set.
NO_ROLE_SWITCH = "refused: a PD role switch is decided per TP rank, with no agreement (docs/desync-audit.md)"
# SGLang's LoRA serving decides per TP rank what the group must agree: an adapter load's outcome (only the TP
# leader's reply reaches the tokenizer), whether an adapter copied asynchronously is ready (this rank's CUDA
# event) and whether a starving adapter is drained (this rank's clock), both in admitting requests. These two
# flags are the only ones that turn LoRA on: without them SGLang builds no LoRA manager (docs/desync-audit.md).
NO_LORA = "refused: LoRA adapters are loaded and admitted per TP rank, with no agreement (docs/desync-audit.md)"
# FlexKV's radix cache fans its leader's answers out to the TP ranks by point-to-point sends the followers receive
# in call order, unmatched to the call: a call one rank makes alone (an eviction its own free KV asks for drains
# store completions) mis-pairs every later message. `--radix-cache-backend` picks a cache by a registered name, and
# in SGLang 0.5.23 only FlexKV registers one (docs/desync-audit.md).
NO_FLEXKV = "refused: FlexKV's cache syncs TP ranks by sends received in call order (docs/desync-audit.md)"
# SGLang's `--api-key` makes every engine endpoint but health, readiness and metrics ask for the key: the router's
# requests, the operator's /server_info (the serverArgs gate) and the drain's /v1/loads would all be refused.
# Clients are authenticated in front of the router (docs/security.md), not at the engines.
NO_CLIENT_KEY = "refused: engines with a client key refuse the router's requests and the operator's reads"
# SGLang's native gRPC server (0.5.23) serves UpdateWeightsFromDisk and the other run-time controls whose HTTP
# routes every pdfleet engine refuses (runtime/refused_routes.py): each rank loads and catches its own failure, so
# one rank that fails desyncs the group. `--grpc-port` (or SGLANG_GRPC_PORT, refused in spec.engine.env) starts it
# beside the HTTP server; `--grpc-mode` and `--smg-grpc-mode` serve the engine over gRPC instead.
NO_GRPC = "refused: SGLang's gRPC server serves the weight updates refused over HTTP (docs/desync-audit.md item 17)"
# SGLang's `--enable-custom-logit-processor` lets a request carry a serialized (dill) logit processor that every
# engine rank deserializes and runs: code execution for any client that reaches the router. Refused until a cluster
# policy can allow it for a pool.
NO_CLIENT_CODE = "refused: it runs code that any client reaching the router sends (docs/security.md)"

# The one table: admission (`reserved_flag`, the CEL rule), the serverArgs gate (`server_args_fields`) and the
# renderer's test (every flag `render.engine_args` writes is here) all read it.
FLAGS: Final[dict[str, ManagedFlag]] = {
    "--model-path": ManagedFlag("spec.model.source", "model_path"),
    "--model": ManagedFlag("spec.model.source", unchecked=ALIAS),
    "--served-model-name": ManagedFlag("spec.model.servedName", "served_model_name"),
    "--tool-call-parser": ManagedFlag("spec.model.toolCallParser", "tool_call_parser"),
    "--reasoning-parser": ManagedFlag("spec.model.reasoningParser", "reasoning_parser"),
    "--chat-template": ManagedFlag("spec.model.chatTemplate", "chat_template"),
    "--trust-remote-code": ManagedFlag("spec.model.trustRemoteCode", "trust_remote_code", bool),
    "--host": ManagedFlag("the operator (pods listen on all interfaces)",
                          unchecked="a bind address: the pod's runtime may narrow 0.0.0.0 to the pod's IP"),
    "--port": ManagedFlag("spec.<role>.port", "port", int),
    "--tp-size": ManagedFlag("spec.<role>.tp", "tp_size", int),
    "--tensor-parallel-size": ManagedFlag("spec.<role>.tp", unchecked=ALIAS),
    # Rendered only with --enable-dp-attention, under which SGLang 0.5.23 resolves the size into attn_dp_size
    # (and leaves dp_size at 1).
    "--dp-size": ManagedFlag("spec.<role>.dp", "attn_dp_size", int),
    "--data-parallel-size": ManagedFlag("spec.<role>.dp", unchecked=ALIAS),
    "--enable-dp-attention": ManagedFlag("spec.<role>.dp", "enable_dp_attention", bool),
    "--pp-size": ManagedFlag("the operator (pipeline parallelism is not supported)", unchecked=NO_PP),
    "--pipeline-parallel-size": ManagedFlag("the operator (pipeline parallelism is not supported)",
                                            unchecked=NO_PP),
    "--nnodes": ManagedFlag("spec.<role>.nodesPerGroup", "nnodes", int),
    "--node-rank": ManagedFlag("the operator (one per pod of a group)", "node_rank", int),
    "--dist-init-addr": ManagedFlag("the operator (rank 0's pod of a group)", "dist_init_addr"),
    "--disaggregation-mode": ManagedFlag("the role (prefill or decode)", "disaggregation_mode"),
    "--enable-pd-role-switch": ManagedFlag("the operator (a role switch is refused: the pool's roles are fixed)",
                                           unchecked=NO_ROLE_SWITCH),
    "--enable-lora": ManagedFlag("the operator (LoRA adapters are refused)", unchecked=NO_LORA),
    "--lora-paths": ManagedFlag("the operator (LoRA adapters are refused)", unchecked=NO_LORA),
    "--enable-flexkv": ManagedFlag("the operator (the FlexKV cache is refused)", unchecked=NO_FLEXKV),
    "--radix-cache-backend": ManagedFlag("the operator (a registered radix-cache back-end is refused)",
                                         unchecked=NO_FLEXKV),
    "--grpc-port": ManagedFlag("the operator (SGLang's gRPC server is refused)", unchecked=NO_GRPC),
    "--grpc-mode": ManagedFlag("the operator (SGLang's gRPC server is refused)", unchecked=NO_GRPC),
    "--smg-grpc-mode": ManagedFlag("the operator (SGLang's gRPC server is refused)", unchecked=NO_GRPC),
    "--disaggregation-bootstrap-port": ManagedFlag("spec.prefill.bootstrapPort", "disaggregation_bootstrap_port",
                                                   int),
    "--disaggregation-transfer-backend": ManagedFlag("spec.transfer.backend", "disaggregation_transfer_backend"),
    "--disaggregation-ib-device": ManagedFlag("spec.transfer.ibDevice", "disaggregation_ib_device"),
    "--disable-overlap-schedule": ManagedFlag("spec.engine.overlapSchedule", "disable_overlap_schedule", bool,
                                              switch=True),
    "--disable-tokenizer-batch-decode": ManagedFlag("spec.engine.tokenizerBatchDecode",
                                                    "disable_tokenizer_batch_decode", bool, switch=True),
    "--enable-metrics": ManagedFlag("the operator (metrics are always on)", "enable_metrics", bool),
    "--api-key": ManagedFlag("the operator (a client key on engines would shut out the router and the operator)",
                             unchecked=NO_CLIENT_KEY),
    "--enable-custom-logit-processor": ManagedFlag("the operator (clients' custom logit processors are refused)",
                                                   unchecked=NO_CLIENT_CODE),
}
MANAGED_FLAGS: Final[dict[str, str]] = {name: flag.owner for name, flag in FLAGS.items()}


def option_name(arg: str) -> str:
    """'--tp-size=8' -> '--tp-size'."""
    return arg.split("=", 1)[0]


def reserved_flag(arg: str) -> str | None:
    """The managed flag `arg` would set (exactly or as an argparse abbreviation), or None for a free arg."""
    if not arg.startswith("--"):
        return None
    name = option_name(arg)
    for flag in MANAGED_FLAGS:
        if flag.startswith(name):
            return flag
    return None


# SGLang flags that change how KV pages are laid out or read: prefill and decode must agree on them, so the
# operator reads them from extraArgs to keep old and new layouts from serving one router (its render/layout.py),
# and a config file may not set them, where the operator could not see them (engine_config).
LAYOUT_FLAGS: Final = ("--page-size", "--kv-cache-dtype", "--attention-backend", "--prefill-attention-backend",
                       "--decode-attention-backend", "--dsa-prefill-backend", "--dsa-decode-backend")


def layout_flag(name: str) -> str | None:
    """The layout flag an option name sets: itself, or one it abbreviates (SGLang's parser takes any unambiguous
    prefix, so `--page-siz 32` sets the page size). A prefix of several counts as itself: whatever SGLang makes of
    it, it is counted."""
    if not name.startswith("--") or len(name) <= 2:
        return None
    found = [flag for flag in LAYOUT_FLAGS if flag.startswith(name)]
    return name if name in LAYOUT_FLAGS or len(found) > 1 else (found[0] if found else None)

# SGLang's switch for agreeing on sampled tokens across TP ranks: the renderer sets it on every group of more than
# one rank (render/engine_group.py), so spec.engine.env may not.
TOKEN_AGREEMENT_ENV: Final = "SYNC_TOKEN_IDS_ACROSS_TP"

# Environment variables SGLang (0.5.23) reads that turn agreement across TP ranks off, or open a way around the
# refusals above, or that the operator sets; refused in spec.engine.env by name (docs/desync-audit.md).
REFUSED_ENV: Final[dict[str, str]] = {
    "SGLANG_GRPC_PORT": "it starts SGLang's gRPC server, which serves the weight updates refused over HTTP",
    "SGLANG_SCHEDULER_SKIP_ALL_GATHER": "with DP attention each rank then uses its own token counts and CUDA-graph "
                                        "vote instead of the group's",
    "SGLANG_SPEC_TP_SYNC": "it drops the rank-0 broadcasts that keep speculative decoding's ranks in step",
    TOKEN_AGREEMENT_ENV: "the operator sets it: every group of more than one TP rank agrees on its sampled tokens",
}
