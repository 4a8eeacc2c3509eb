"""Patch id -> the module that implements it. Imported on demand: an implementation module may import SGLang."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from pdfleet.runtime.patches.base import Implementation

MODULES: dict[str, str] = {
    "kv-poll-lockstep": "pdfleet.runtime.patches.impl.kv_poll_lockstep",
    "abort-consensus": "pdfleet.runtime.patches.impl.abort_consensus",
    "health-check-consensus": "pdfleet.runtime.patches.impl.health_check_consensus",
    "retraction-consensus": "pdfleet.runtime.patches.impl.retraction_consensus",
    "admission-consensus": "pdfleet.runtime.patches.impl.admission_consensus",
    "flush-consensus": "pdfleet.runtime.patches.impl.flush_consensus",
    "grammar-consensus": "pdfleet.runtime.patches.impl.grammar_consensus",
    "overlap-loop-report": "pdfleet.runtime.patches.impl.overlap_loop_report",
    "dsml-leak-guard": "pdfleet.runtime.patches.impl.dsml_leak_guard",
    "dsml-batch-decode-guard": "pdfleet.runtime.patches.impl.dsml_batch_decode_guard",
    "bf16-index-keys": "pdfleet.runtime.patches.impl.bf16_index_keys",
}


def implementations(patch_ids: Iterable[str]) -> dict[str, Implementation]:
    return {pid: importlib.import_module(MODULES[pid]) for pid in patch_ids if pid in MODULES}  # type: ignore[misc]
