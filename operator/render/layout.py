"""The KV layout a pool's engines share: what must match between a prefill and a decode engine for a KV
transfer to mean anything.

Prefill writes KV pages that decode reads, so both must agree on the index-key dtype (the bf16-index-keys
patch), the page size, the KV cache dtype and the attention backend that lays the pages out. A rollout that
changes any of these must never let an old-layout group and a new-layout group serve the same router: the
planner replaces every group at once instead (see planning/reconcile.py).
"""

from __future__ import annotations

import hashlib
import json

from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.runtime.engine_flags import layout_flag
from pdfleet.runtime.patches import catalogue


def _flag_values(args: tuple[str, ...]) -> dict[str, str]:
    values: dict[str, str] = {}
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if (flag := layout_flag(name)) is not None:
            values[flag] = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
    return values


def kv_layout(spec: InferencePoolSpec) -> str:
    """A short hash of everything that shapes the KV layout; equal hashes can exchange KV caches."""
    data = {
        "model": spec.model.source.model_dump(mode="json"),
        "patches": sorted(p for p in spec.engine.patches if catalogue.BY_ID[p].kv_layout),
        "flags": _flag_values(tuple(spec.engine.extra_args)),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:10]
