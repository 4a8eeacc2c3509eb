"""SGLang flags the operator owns: it derives them from typed fields, so `extraArgs` may not set them.

Each flag maps to the spec field that owns it (or the reason it is refused), so a refusal can say what to set
instead. Aliases are listed too (`--tp` and `--tensor-parallel-size` both set tp_size). SGLang builds its
parser with argparse's default `allow_abbrev=True`, so any unambiguous prefix of a flag also sets it
(`--disaggregation-mo decode`): an extra arg is refused when its option name is a prefix of a managed flag,
not only when it equals one. The CEL rule in `engine.py` and `reserved_flag` below implement that one test.
"""

from __future__ import annotations

from typing import Final

MANAGED_FLAGS: Final[dict[str, str]] = {
    "--model-path": "spec.model.source",
    "--model": "spec.model.source",
    "--served-model-name": "spec.model.servedName",
    "--tool-call-parser": "spec.model.toolCallParser",
    "--reasoning-parser": "spec.model.reasoningParser",
    "--chat-template": "spec.model.chatTemplate",
    "--trust-remote-code": "spec.model.trustRemoteCode",
    "--host": "the operator (pods listen on all interfaces)",
    "--port": "spec.<role>.port",
    "--tp-size": "spec.<role>.tp",
    "--tensor-parallel-size": "spec.<role>.tp",
    "--dp-size": "spec.<role>.dp",
    "--data-parallel-size": "spec.<role>.dp",
    "--enable-dp-attention": "spec.<role>.dp",
    "--pp-size": "the operator (pipeline parallelism is not supported)",
    "--pipeline-parallel-size": "the operator (pipeline parallelism is not supported)",
    "--nnodes": "spec.<role>.nodesPerGroup",
    "--node-rank": "the operator (one per pod of a group)",
    "--dist-init-addr": "the operator (rank 0's pod of a group)",
    "--disaggregation-mode": "the role (prefill or decode)",
    "--disaggregation-bootstrap-port": "spec.prefill.bootstrapPort",
    "--disaggregation-transfer-backend": "spec.transfer.backend",
    "--disaggregation-ib-device": "spec.transfer.ibDevice",
    "--disable-overlap-schedule": "spec.engine.overlapSchedule",
    "--disable-tokenizer-batch-decode": "spec.engine.tokenizerBatchDecode",
    "--enable-metrics": "the operator (metrics are always on)",
}


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


def cel_list(flags: dict[str, str] = MANAGED_FLAGS) -> str:
    """The managed flags as a CEL list literal."""
    return "[" + ", ".join(f"'{flag}'" for flag in flags) + "]"
