"""What one reconcile will do: the output of the pure planner, the input of the executor."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pdfleet.operator.kube.events import Event
from pdfleet.operator.render import labels

Body = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    uid: str | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
    apply: tuple[Body, ...] = ()  # desired objects that differ from what the cluster has
    delete: tuple[ObjectRef, ...] = ()  # owned objects no longer desired
    status: Body | None = None  # the new status, or None when it would not change
    events: tuple[Event, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.apply or self.delete or self.status is not None or self.events)


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
