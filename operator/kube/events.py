"""Kubernetes Events about a pool, the way `kubectl describe` and `kubectl get events` show them."""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Mapping
from typing import Any

from pdfleet.operator.planning.plan import Event

COMPONENT = "pdfleet-operator"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(regarding: Mapping[str, Any], event: Event) -> dict[str, Any]:
    """A core/v1 Event about `regarding`. Messages never carry secrets: they are built from spec fields,
    names and counts only."""
    meta = regarding["metadata"]
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": regarding["apiVersion"], "kind": regarding["kind"], "name": meta["name"],
            "namespace": meta["namespace"], "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": f"pdfleet.dev/{COMPONENT}",
        "reportingInstance": os.environ.get("HOSTNAME") or socket.gethostname(),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
