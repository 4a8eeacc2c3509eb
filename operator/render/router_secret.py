"""The pool's router-key Secret as an object, and how a router pod refers to its key (`planning.router.router_keys`
decides what the Secret holds)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from pdfleet.operator.api.router import ROUTER_KEY_ENV
from pdfleet.operator.render import labels

Body = dict[str, Any]

HANDLED_ANNOTATION = f"{labels.PREFIX}/rotated-for"  # the rotation value last acted on
CURRENT_ANNOTATION = f"{labels.PREFIX}/current-key"  # the key new router pods get
ENV = ROUTER_KEY_ENV  # the router container's variable; its args refer to it as $(ENV)
KEY_ID = "pdfleet-operator"  # the principal the router's audit log names for the operator's calls
COMPONENT = "router-key"


def secret_name(pool: str) -> str:
    return f"{pool}-router-key"


def reference(pool: str) -> Body:
    """The Secret as far as its name goes: what is read to learn whether the name is taken (`planning.ownership`)."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret_name(pool)}}


def referenced_key(pod: Mapping[str, Any], pool: str) -> str | None:
    """The key name a router pod's container takes from its pool's Secret, as its spec says."""
    for container in pod.get("spec", {}).get("containers") or []:
        for var in container.get("env") or []:
            ref = (var.get("valueFrom") or {}).get("secretKeyRef") or {}
            if var.get("name") == ENV and ref.get("name") == secret_name(pool):
                return str(ref.get("key", "")) or None
    return None


def secret(pool: str, namespace: str, owner: Mapping[str, Any], *, keys: Mapping[str, str], current: str,
           handled: str) -> Body:
    """The Secret holding `keys` (name -> value): owned by the pool (deleted with it), typed Opaque."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {
            "name": secret_name(pool), "namespace": namespace,
            "labels": labels.common(pool, COMPONENT),
            "annotations": {CURRENT_ANNOTATION: current, HANDLED_ANNOTATION: handled},
            "ownerReferences": [dict(owner)],
        },
        "data": {n: base64.b64encode(v.encode()).decode() for n, v in sorted(keys.items())},
    }
