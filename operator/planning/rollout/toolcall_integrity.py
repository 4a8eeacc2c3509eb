"""Whether a pool's tool calls are safe from the DSML batch-decode leak, as the `ToolCallIntegrity` condition
says. Pure: from the spec alone.

SGLang 0.5.0 up to 0.5.7 detokenize a batch with the first request's `skip_special_tokens`: a tool request batched
behind a plain one loses the `｜DSML｜` special tokens of its tool calls, which then reach the client as text.
A pool is exposed when it parses DSML tool calls (a DeepSeek V3.2 or V4 parser) on such a release and neither
`dsml-batch-decode-guard` (the patch) nor, below 0.5.7, `tokenizerBatchDecode: Disabled` (SGLang's own switch,
which still decodes mixed batches with one request's options in 0.5.7, where admission refuses it) protects it.
The pool still runs: it serves, but a person should know.
"""

from __future__ import annotations

import dataclasses

from pdfleet.operator.api import checks
from pdfleet.operator.api.conditions import ConditionStatus
from pdfleet.operator.api.engine import Switch
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.runtime.patches import catalogue

PATCH = "dsml-batch-decode-guard"
DSML_PARSERS = frozenset({"deepseekv32", "deepseekv4", "deepseekv41"})


@dataclasses.dataclass(frozen=True)
class Integrity:
    status: ConditionStatus
    reason: str
    message: str


def judge(spec: InferencePoolSpec) -> Integrity:
    parser = spec.model.tool_call_parser
    version = spec.engine.sglang_version
    if parser not in DSML_PARSERS:
        return Integrity(ConditionStatus.TRUE, "NoDSMLParser",
                         f"tool-call parser {parser or 'unset'}: no DSML tool calls to lose")
    affected = catalogue.BY_ID[PATCH].applies_to
    if version not in affected:
        return Integrity(ConditionStatus.TRUE, "NotAffected",
                         f"SGLang {version} detokenizes each request with its own options")
    if PATCH in spec.engine.patches:
        return Integrity(ConditionStatus.TRUE, "Patched", f"SGLang {version} with the {PATCH} patch")
    if spec.engine.tokenizer_batch_decode is Switch.DISABLED and version not in checks.BATCH_DECODE_SWITCH_INEFFECTIVE:
        return Integrity(ConditionStatus.TRUE, "BatchDecodeDisabled",
                         f"SGLang {version} with tokenizerBatchDecode: Disabled")
    return Integrity(ConditionStatus.FALSE, "BatchDecodeLeak",
                     f"SGLang {version} decodes a batch with one request's skip_special_tokens, so {parser} tool "
                     f"calls batched behind plain requests can reach clients as DSML text: add {PATCH} to "
                     f"spec.engine.patches (or run SGLang {catalogue.BY_ID[PATCH].fixed_in} or later)")
