"""The runner's one door to the apiserver: a small aiohttp client on the cluster's admin kubeconfig (the
runner is the node agent). Only what a kubelet does: list and watch pods and nodes, write pod status, delete
a pod, ask for ServiceAccount tokens, post events."""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

Body = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class Replaced(ApiError):
    """The pod of that name is not the one meant any more (deleted and created again): a write about the old
    one must never land on its successor."""


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


def _material(entry: Mapping[str, Any], key: str, base_dir: Path) -> str | None:
    """A kubeconfig's file reference or inline data, as a file path (ssl wants files)."""
    if entry.get(key):
        path = Path(entry[key])
        return str(path if path.is_absolute() else base_dir / path)
    data = entry.get(f"{key}-data")
    if not data:
        return None
    f = tempfile.NamedTemporaryFile(prefix="pdfleet-sim-", delete=False)  # noqa: SIM115 (kept for ssl)
    f.write(base64.b64decode(data))
    f.close()
    Path(f.name).chmod(0o600)
    return f.name


class Kubeconfig:
    def __init__(self, path: Path) -> None:
        config = yaml.safe_load(path.read_text())
        current = config.get("current-context")
        context = next(c["context"] for c in config["contexts"] if c["name"] == current)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        self.server: str = cluster["server"].rstrip("/")
        self.ca_file = _material(cluster, "certificate-authority", path.parent)
        self.cert_file = _material(user, "client-certificate", path.parent)
        self.key_file = _material(user, "client-key", path.parent)
        self.token: str | None = user.get("token")

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file and self.key_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


class Client:
    def __init__(self, config: Kubeconfig) -> None:
        self.config = config
        headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        self._session = aiohttp.ClientSession(
            base_url=config.server, headers=headers,
            connector=aiohttp.TCPConnector(ssl=config.ssl_context(), limit=32))

    async def close(self) -> None:
        await self._session.close()

    async def request(self, method: str, path: str, *, body: Any = None, params: Mapping[str, str] | None = None,
                      content_type: str = "application/json", timeout: float = 30) -> Body:
        data = json.dumps(body) if body is not None else None
        async with self._session.request(method, path, data=data, params=params,
                                         headers={"Content-Type": content_type},
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            text = await r.text()
            if r.status >= 400:
                raise ApiError(r.status, text)
            return json.loads(text) if text else {}

    async def list(self, path: str, params: Mapping[str, str]) -> Body:
        return await self.request("GET", path, params=params)

    async def watch(self, path: str, params: Mapping[str, str], resource_version: str,
                    timeout_s: int = 300) -> AsyncIterator[Body]:
        """Watch events from `resource_version` until the server ends the watch. Raises Gone on 410."""
        query = {**params, "watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(timeout_s)}
        async with self._session.get(path, params=query,
                                     timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s + 30)) as r:
            if r.status == 410:
                raise Gone()
            if r.status >= 400:
                raise ApiError(r.status, await r.text())
            async for line in r.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    if event.get("object", {}).get("code") == 410:
                        raise Gone()
                    raise ApiError(int(event.get("object", {}).get("code") or 500), json.dumps(event["object"]))
                yield event

    async def patch_pod_status(self, namespace: str, name: str, uid: str, patch: Body) -> Body:
        """Writes the status of exactly this pod, as kubelet does: the patch names the pod's uid, which the API
        server refuses to change, so a status about a pod deleted meanwhile (force-deleted, say) never lands on a
        new pod of the same name. Raises `Replaced` then."""
        body = {**patch, "metadata": {**patch.get("metadata", {}), "uid": uid}}
        try:
            return await self.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{quote(name)}/status",
                                      body=body, content_type="application/merge-patch+json")
        except ApiError as e:
            if e.status == 422 and "metadata.uid" in str(e):
                raise Replaced(e.status, str(e)) from e
            raise

    async def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """Deletes exactly this pod (not a newer one of the same name) with no further grace: what kubelet
        does once the containers are gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": uid}}
        try:
            await self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{quote(name)}", body=body)
        except ApiError as e:
            if e.status not in (404, 409):  # gone already, or a newer pod of that name
                raise

    async def create_token(self, namespace: str, service_account: str, pod_name: str, pod_uid: str,
                           seconds: int) -> str:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds,
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid}}}
        out = await self.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{quote(service_account)}/token", body=body)
        return str(out["status"]["token"])

    async def create_event(self, namespace: str, event: Body) -> None:
        await self.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)
