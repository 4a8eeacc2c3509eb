"""A container's environment as kubelet builds it, plus the local-fleet contract (docs/local-fleet.md).

Values may refer to earlier variables as $(NAME) ($$ escapes); valueFrom supports the downward-API fields a
pdfleet pod uses and keys of Secrets and ConfigMaps (`secretKeyRef`, `configMapKeyRef`, read from the apiserver as
kubelet reads them). Anything else (resource fields, envFrom) is refused with a message, which ends up in the pod's
status, rather than silently run with a wrong environment. A referenced value never appears in a message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

FIELD_PATHS = {
    "metadata.name": lambda pod: pod["metadata"]["name"],
    "metadata.namespace": lambda pod: pod["metadata"]["namespace"],
    "metadata.uid": lambda pod: pod["metadata"]["uid"],
    "status.podIP": lambda pod: pod.get("status", {}).get("podIP", ""),
    "status.hostIP": lambda pod: pod.get("status", {}).get("hostIP", ""),
    "spec.nodeName": lambda pod: pod["spec"].get("nodeName", ""),
    "spec.serviceAccountName": lambda pod: pod["spec"].get("serviceAccountName", "default"),
}
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class EnvError(ValueError):
    """The container's env asks for something the runner does not emulate."""


class MissingKey(EnvError):
    """A Secret, ConfigMap or key the env refers to is not there (yet): kubelet retries, and so does the runner."""


def expand(value: str, defined: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: a defined name is replaced, an undefined one stays as written."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return defined.get(name, m.group(0))
    return _REF.sub(sub, value)


# The key selectors the runner resolves, by the kind of object they name. kubelet's env takes a ConfigMap's `data`
# only (not `binaryData`), and a Secret's `data` decoded.
KEY_SELECTORS = {"secretKeyRef": "Secret", "configMapKeyRef": "ConfigMap"}
Sources = Mapping[tuple[str, str], Mapping[str, str]]  # (kind, name) -> its keys' values; a missing object is absent


def referenced(containers: Sequence[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """The (kind, name) of every Secret and ConfigMap the containers' env refers to."""
    return {(kind, str(ref["name"])) for c in containers for var in c.get("env") or []
            for selector, kind in KEY_SELECTORS.items()
            if (ref := (var.get("valueFrom") or {}).get(selector)) and ref.get("name")}


def _key_value(pod: Mapping[str, Any], var: str, kind: str, ref: Mapping[str, Any], sources: Sources) -> str | None:
    """The referenced key's value; None for an optional one that is missing. A missing one fails in kubelet's words
    (`secret "hf" not found`, `couldn't find key token in Secret ns/hf`), never with a value."""
    name, key = str(ref.get("name", "")), str(ref.get("key", ""))
    data = sources.get((kind, name))
    if data is not None and key in data:
        return data[key]
    if ref.get("optional"):
        return None
    if data is None:
        raise MissingKey(f'env {var}: {kind.lower()} "{name}" not found')
    raise MissingKey(f"env {var}: couldn't find key {key} in {kind} {pod['metadata']['namespace']}/{name}")


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any],
                  sources: Sources | None = None) -> dict[str, str]:
    """The variables the container spec sets, resolved against the pod and the keys of its Secrets and ConfigMaps."""
    if container.get("envFrom"):
        raise EnvError("envFrom is not emulated by pdfleet-sim")
    out: dict[str, str] = {}
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" in var:
            source = var["valueFrom"]
            selector = next((s for s in KEY_SELECTORS if s in source), None)
            if selector is not None:
                value = _key_value(pod, name, KEY_SELECTORS[selector], source[selector], sources or {})
                if value is not None:
                    out[name] = value
                continue
            field = (source.get("fieldRef") or {}).get("fieldPath")
            if field not in FIELD_PATHS:
                what = field or next(iter(source), "valueFrom")
                raise EnvError(f"env {name}: valueFrom {what} is not emulated by pdfleet-sim (supported fieldRefs: "
                               f"{', '.join(FIELD_PATHS)})")
            out[name] = str(FIELD_PATHS[field](pod))
        else:
            out[name] = expand(str(var.get("value", "")), out)
    return out


def contract_env(*, pod_ip: str, pod_dir: str, kubeconfig: str | None) -> dict[str, str]:
    """What stands in for the pod's own network namespace, /dev/shm, downward API, token and (absent) GPUs."""
    env = {
        "PDFLEET_BIND_ADDRESS": pod_ip,
        "PDFLEET_LEDGER_PATH": f"{pod_dir}/shm/pdfleet-ledger",
        "PDFLEET_PODINFO": f"{pod_dir}/podinfo",
        "PDFLEET_ENGINE_MODE": "simulate",
        "HF_HUB_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",  # a closed port: any attempt to reach the hub fails at once
    }
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    return env


def base_env(*, path: str, home: str, hostname: str) -> dict[str, str]:
    """What a container gets from its image and runtime. Nothing of the runner's own environment leaks in:
    above all not the admin KUBECONFIG."""
    return {"PATH": path, "HOME": home, "HOSTNAME": hostname, "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}


def build(pod: Mapping[str, Any], container: Mapping[str, Any], *, base: Mapping[str, str],
          contract: Mapping[str, str], sources: Sources | None = None) -> dict[str, str]:
    """base, then the container's own, then the contract: the emulation must win (a container's KUBECONFIG
    or bind address would point at things that do not exist here)."""
    return {**base, **container_env(pod, container, sources), **contract}
