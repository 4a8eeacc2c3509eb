"""A pod's ServiceAccount identity: a TokenRequest token bound to the pod (it dies with the pod, as a
projected token does), written into a kubeconfig only that pod's processes read. Never logged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pdfleet.podrunner.kube import Client
from pdfleet.podrunner.podinfo import write_atomically

# kubelet asks for about an hour and refreshes; the local apiserver extends service-account tokens it
# issues to a year (--service-account-extend-token-expiration), so one token outlives any local pod.
TOKEN_SECONDS = 3607


def wants_token(pod: dict[str, Any]) -> bool:
    return pod["spec"].get("automountServiceAccountToken") is not False


def kubeconfig_text(*, server: str, ca_file: str | None, token: str, user: str) -> str:
    cluster: dict[str, Any] = {"server": server}
    if ca_file:
        cluster["certificate-authority"] = ca_file
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    })


async def write_pod_kubeconfig(client: Client, pod: dict[str, Any], path: Path) -> Path:
    meta = pod["metadata"]
    account = pod["spec"].get("serviceAccountName") or "default"
    token = await client.create_token(meta["namespace"], account, meta["name"], meta["uid"], TOKEN_SECONDS)
    text = kubeconfig_text(server=client.config.server, ca_file=client.config.ca_file, token=token,
                           user=f"system:serviceaccount:{meta['namespace']}:{account}")
    write_atomically(path, text, mode=0o600)
    return path
