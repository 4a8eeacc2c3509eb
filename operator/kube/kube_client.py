"""The operator's only door to the Kubernetes API.

Everything the operator writes goes through `KubeClient.request` (and what `pdfleet rollout status --watch`
follows, through `KubeClient.watch`), so every call is counted (by verb, resource and status code) and every
third-party error is translated here into `KubeError`. Code above this module deals in plain dicts and never sees
aiohttp or kubernetes_asyncio.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from pdfleet.operator import metrics
from pdfleet.operator.kube import api_paths

log = logging.getLogger(__name__)

FIELD_MANAGER = "pdfleet-operator"
Body = dict[str, Any]


@dataclasses.dataclass
class KubeError(Exception):
    status: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


def _refusal(status: int, raw: bytes) -> KubeError:
    """The apiserver's answer other than 2xx: its Status object's reason and message when it sent one."""
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        data = {}
    data = data if isinstance(data, dict) else {}
    return KubeError(status, data.get("reason", "Unknown"), data.get("message", raw.decode(errors="replace")))


async def load_configuration(kubeconfig: str | None = None) -> k8s.Configuration:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG or the given path)."""
    cfg = k8s.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=cfg)
    except k8s_config.ConfigException:
        await k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return cfg


def _without_env_lookups(configuration: k8s.Configuration) -> k8s.ApiClient:
    """An ApiClient whose session reads the environment's proxy settings once, here, instead of per request:
    kubernetes_asyncio's session trusts the environment, so aiohttp looked up netrc and the proxy variables in a
    thread for every request, two thread hand-offs per write (a tenth of the operator's CPU in a burst, and
    latency on a busy machine). HTTPS_PROXY and NO_PROXY still apply, as they do for kubectl."""
    if not configuration.proxy:
        host = urllib.parse.urlsplit(configuration.host).hostname or ""
        scheme = urllib.parse.urlsplit(configuration.host).scheme or "https"
        proxy = urllib.request.getproxies().get(scheme)
        if proxy and not urllib.request.proxy_bypass(host):
            configuration.proxy = proxy
    api = k8s.ApiClient(configuration)
    session = api.rest_client.pool_manager
    if isinstance(session, aiohttp.ClientSession) and hasattr(session, "_trust_env"):
        session._trust_env = False  # aiohttp offers no setter; the proxy is settled above
    return api


class KubeClient:
    def __init__(self, configuration: k8s.Configuration) -> None:
        self._api = _without_env_lookups(configuration)

    async def close(self) -> None:
        await self._api.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Body:
        resource = api_paths.resource_of(path)
        try:
            response = await self._api.call_api(
                path, method,
                query_params=list((query or {}).items()),
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                # A JSON Patch (application/json-patch+json) is a list of operations; every other body an object.
                body=None if body is None else dict(body) if isinstance(body, Mapping) else [dict(o) for o in body],
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
            status = response.status
            raw = await response.read()
        except (aiohttp.ClientError, TimeoutError, ApiException) as e:
            metrics.KUBE_REQUESTS.labels(verb=method, resource=resource, code="error").inc()
            raise KubeError(0, "ConnectionError", f"{method} {path}: {e}") from e
        metrics.KUBE_REQUESTS.labels(verb=method, resource=resource, code=str(status)).inc()
        if not 200 <= status < 300:
            raise _refusal(status, raw)
        return json.loads(raw) if raw else {}

    async def watch(self, path: str, *, query: Mapping[str, str] | None = None,
                    timeout: float = 330) -> AsyncIterator[Body]:
        """The events of a watch on the list `path` (`watch=1` is added), each {"type", "object"}, as they come,
        until the apiserver ends the watch (its `timeoutSeconds`) or `timeout` passes. An ERROR event (410 Gone:
        the resourceVersion is too old to watch from) is raised as the KubeError it carries."""
        resource = api_paths.resource_of(path)
        response = None
        try:
            response = await self._api.call_api(
                path, "GET",
                query_params=[*(query or {}).items(), ("watch", "1")],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
            metrics.KUBE_REQUESTS.labels(verb="WATCH", resource=resource, code=str(response.status)).inc()
            if not 200 <= response.status < 300:
                raise _refusal(response.status, await response.read())
            pending = b""
            # Chunks, not readline: one event is a whole object, which can outgrow aiohttp's line limit.
            async for chunk in response.content.iter_any():
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        obj = event.get("object") or {}
                        raise KubeError(obj.get("code", 500), obj.get("reason", "Unknown"), obj.get("message", ""))
                    yield event
        except (aiohttp.ClientError, TimeoutError, ApiException) as e:
            metrics.KUBE_REQUESTS.labels(verb="WATCH", resource=resource, code="error").inc()
            raise KubeError(0, "ConnectionError", f"WATCH {path}: {e}") from e
        finally:
            if response is not None:
                response.release()

    async def apply(self, obj: Mapping[str, Any], *, force: bool = True) -> Body:
        """Server-side apply with pdfleet's single field manager."""
        query = {"fieldManager": FIELD_MANAGER, "force": "true" if force else "false"}
        return await self.request("PATCH", api_paths.object_path(obj), body=obj, query=query,
                                  content_type="application/apply-patch+yaml")

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str,
                     *, uid: str | None = None, grace_period_seconds: int | None = None) -> None:
        """Deletes in the background (dependents go with it); a precondition on `uid` avoids deleting a
        same-named successor. A 404 is success: the object is already gone."""
        body: Body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        path = api_paths.path_for(api_version, kind, namespace, name)
        try:
            await self.request("DELETE", path, body=body)
        except KubeError as e:
            if not e.not_found:
                raise

    async def create(self, obj: Mapping[str, Any]) -> Body:
        """Creates `obj`, recorded under pdfleet's field manager (a 409 when the name is taken)."""
        meta = obj["metadata"]
        path = api_paths.path_for(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        return await self.request("POST", path, body=obj, query={"fieldManager": FIELD_MANAGER})
