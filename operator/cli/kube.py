"""The CLI's reads, with the user's kubeconfig, through the operator's own client (`kube/kube_client.py`). Every failure
becomes a `CliError`: one line that names what went wrong (no kubeconfig, the pool not found, forbidden, the
apiserver unreachable), never a traceback."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from kubernetes_asyncio import config as k8s_config

from pdfleet.operator.api import role_scale
from pdfleet.operator.api.meta import API_VERSION, KIND
from pdfleet.operator.kube import api_paths, pool_patch
from pdfleet.operator.kube.kube_client import KubeClient, KubeError, load_configuration
from pdfleet.operator.planning.health.restarts import EVIDENCE
from pdfleet.operator.planning.spec_change import SpecChange
from pdfleet.operator.render import labels

Body = dict[str, Any]
REQUEST_TIMEOUT = 15.0  # seconds; a person waits for every read
WATCH_SECONDS = 300  # the apiserver ends each watch after this; the CLI then reads the pool and watches again


class CliError(Exception):
    """What went wrong, in one line for the person at the terminal."""


def default_namespace(kubeconfig: str | None) -> str:
    """The namespace of the kubeconfig's current context, like kubectl; `default` when it names none."""
    try:
        _, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)
    except (k8s_config.ConfigException, OSError, TypeError, KeyError):
        return "default"
    return ((active or {}).get("context") or {}).get("namespace") or "default"


def _require_kubeconfig(kubeconfig: str | None) -> None:
    """Outside a pod, the kubeconfig kubectl would read (the flag, else KUBECONFIG's first file, else
    ~/.kube/config) must exist: say which one is missing rather than the client library's generic message."""
    given = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    path = os.path.expanduser(given or "~/.kube/config")
    if not os.environ.get("KUBERNETES_SERVICE_HOST") and not os.path.exists(path):
        raise CliError(f"no kubeconfig: {path} does not exist (set KUBECONFIG or pass --kubeconfig)")


async def connect(kubeconfig: str | None) -> tuple[KubeClient, str]:
    """A client with the user's credentials (in a pod: its ServiceAccount's), and the apiserver's address."""
    _require_kubeconfig(kubeconfig)
    try:
        configuration = await load_configuration(kubeconfig)
    except (k8s_config.ConfigException, OSError) as e:
        where = kubeconfig or "KUBECONFIG or ~/.kube/config"
        raise CliError(f"no usable kubeconfig ({where}): {e}") from None
    return KubeClient(configuration), configuration.host


@dataclasses.dataclass
class PoolReader:
    """Reads one pool and what `pdfleet status` shows next to it."""

    client: KubeClient
    host: str
    namespace: str
    name: str

    def _error(self, e: KubeError, what: str) -> CliError:
        if e.status == 0:
            return CliError(f"cannot reach the Kubernetes API at {self.host}: {e.message}")
        if e.status == 401:
            return CliError(f"the Kubernetes API at {self.host} refused the kubeconfig's credentials: {e.message}")
        if e.status == 403:
            return CliError(f"forbidden: {e.message}")
        if e.status == 404 and what == "pool":
            if f'"{self.name}"' in e.message:
                return CliError(f'InferencePool "{self.name}" not found in namespace "{self.namespace}"')
            return CliError(f"the InferencePool API ({API_VERSION}) is not installed in the cluster at "
                            f"{self.host}: {e.message}")
        return CliError(f"reading {what} of InferencePool {self.namespace}/{self.name}: {e}")

    async def _get(self, path: str, what: str, query: Mapping[str, str] | None = None) -> Body:
        try:
            return await self.client.request("GET", path, query=query, timeout=REQUEST_TIMEOUT)
        except KubeError as e:
            raise self._error(e, what) from None

    def _list_path(self, api_version: str, kind: str) -> str:
        return api_paths.path_for(api_version, kind, self.namespace)

    async def pool(self) -> Body:
        return await self._get(api_paths.path_for(API_VERSION, KIND, self.namespace, self.name), "pool")

    async def pods(self) -> list[Body]:
        selector = ",".join(f"{k}={v}" for k, v in labels.selector(self.name).items())
        return (await self._get(self._list_path("v1", "Pod"), "the pods",
                                {"labelSelector": selector})).get("items") or []

    async def warnings(self) -> list[Body]:
        fields = f"involvedObject.kind={KIND},involvedObject.name={self.name},type=Warning"
        return (await self._get(self._list_path("v1", "Event"), "the Events",
                                {"fieldSelector": fields})).get("items") or []

    async def evidence(self) -> list[Body]:
        selector = f"{labels.POOL}={self.name},{EVIDENCE}=true"
        return (await self._get(self._list_path("v1", "ConfigMap"), "the evidence ConfigMaps",
                                {"labelSelector": selector})).get("items") or []

    async def scale_targets(self) -> list[Body]:
        """The pool's InferencePoolRoles; none where their CRD is not installed (an older pdfleet's cluster)."""
        selector = ",".join(f"{k}={v}" for k, v in labels.selector(self.name).items())
        try:
            found = await self.client.request("GET", self._list_path(API_VERSION, role_scale.KIND),
                                              query={"labelSelector": selector}, timeout=REQUEST_TIMEOUT)
        except KubeError as e:
            if e.status == 404:
                return []
            raise self._error(e, "the InferencePoolRoles") from None
        return found.get("items") or []

    async def change(self, pool: Body, change: SpecChange) -> Body | None:
        """Patches the pool as read (guarded by its generation): the pool as stored, or None when its spec
        changed since it was read."""
        try:
            return await pool_patch.patch_pool(self.client, pool, change)
        except KubeError as e:
            raise self._error(e, "a patch") from None

    async def watch(self, resource_version: str) -> AsyncIterator[Body]:
        """Watch events ({"type", "object"}) of this pool from `resource_version` until the apiserver ends the
        watch. A 410 Gone (the version is too old to watch from) ends it too: the caller reads the pool again."""
        query = {"fieldSelector": f"metadata.name={self.name}", "resourceVersion": resource_version,
                 "timeoutSeconds": str(WATCH_SECONDS)}
        try:
            async for event in self.client.watch(self._list_path(API_VERSION, KIND), query=query,
                                                 timeout=WATCH_SECONDS + 30):
                yield event
        except KubeError as e:
            if e.status != 410:
                raise self._error(e, "watch") from None
