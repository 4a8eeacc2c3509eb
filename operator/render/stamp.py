"""Content hashes on desired objects: how a reconcile tells, without a write, that an object is unchanged."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pdfleet.operator.render import labels

Body = dict[str, Any]


def content_hash(obj: Mapping[str, Any]) -> str:
    """A stable hash of a desired object (its applied-hash annotation excluded)."""
    meta = dict(obj.get("metadata", {}))
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != labels.APPLIED_HASH}
    meta["annotations"] = annotations
    canonical = json.dumps({**obj, "metadata": meta}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def stamped(obj: Body) -> Body:
    """The object with its content hash in an annotation, so the next plan can tell it is unchanged."""
    meta = dict(obj["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), labels.APPLIED_HASH: content_hash(obj)}
    return {**obj, "metadata": meta}


def applied_hash(obj: Mapping[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(labels.APPLIED_HASH)
