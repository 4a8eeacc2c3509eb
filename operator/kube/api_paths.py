"""Where each kind the operator touches lives in the API: a fixed table, so no discovery calls are needed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdfleet.operator.api import role_scale
from pdfleet.operator.api.meta import API_VERSION as POOL_API_VERSION

# (apiVersion, kind) -> plural. Only what pdfleet reads or writes; an unknown kind is a programming error.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "Pod"): "pods",
    ("v1", "Service"): "services",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "Event"): "events",
    ("apps/v1", "Deployment"): "deployments",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    (POOL_API_VERSION, "InferencePool"): "inferencepools",
    (POOL_API_VERSION, role_scale.KIND): role_scale.PLURAL,
}


def path_for(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    try:
        plural = PLURALS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"pdfleet does not manage {kind} of {api_version}") from None
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{prefix}{ns}/{plural}" + (f"/{name}" if name else "")


def object_path(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return path_for(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])


def resource_of(path: str) -> str:
    """The plural resource a request path addresses (its metrics label): the segment after the namespace,
    or after the API version for cluster-scoped paths."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if "namespaces" in parts:
        i = parts.index("namespaces")
        return parts[i + 2] if len(parts) > i + 2 else "namespaces"
    start = 2 if parts[:1] == ["api"] else 3
    return parts[start] if len(parts) > start else "unknown"
