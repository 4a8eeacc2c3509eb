"""The pod runner reads the Secrets and ConfigMaps a pod's env refers to as kubelet does: each from its own path, a
Secret's data decoded and a ConfigMap's taken as it is, a missing one left for the env to report in kubelet's words,
and a read that fails otherwise retried (tests/integration/test_pod_runner.py runs it against the apiserver)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any, cast

import pytest

from pdfleet.podrunner import env
from pdfleet.podrunner.kube import ApiError
from pdfleet.podrunner.node import Node
from pdfleet.podrunner.pod import PodWorker, Refused

Body = dict[str, Any]


class FakeClient:
    def __init__(self, objects: dict[str, Body | int]) -> None:
        self.objects = objects  # path -> object, or the HTTP status its read fails with
        self.gets: list[str] = []

    async def request(self, method: str, path: str, **_: Any) -> Body:
        assert method == "GET"
        self.gets.append(path)
        found = self.objects.get(path, 404)
        if isinstance(found, int):
            raise ApiError(found, "refused")
        return found


def worker(client: FakeClient, tmp_path: Path, env_vars: list[Body]) -> PodWorker:
    node = cast(Node, type("FakeNode", (), {"client": client, "pod_dir": lambda self, ns, n: tmp_path / ns / n})())
    return PodWorker(node, {"metadata": {"name": "p", "namespace": "ns", "uid": "u0"},
                            "spec": {"containers": [{"name": "main", "env": env_vars}]}, "status": {}})


def ref(selector: str, name: str, key: str = "k", **more: Any) -> Body:
    return {"name": f"{selector}-{name}-{key}", "valueFrom": {selector: {"name": name, "key": key, **more}}}


SECRET = "/api/v1/namespaces/ns/secrets/s"
CONFIG_MAP = "/api/v1/namespaces/ns/configmaps/c"


def test_secrets_are_decoded_config_maps_taken_as_they_are_and_a_missing_one_is_left_out(tmp_path: Path) -> None:
    client = FakeClient({
        SECRET: {"data": {"k": base64.b64encode(b"hush").decode()}},
        # kubelet's env takes `data` only; a key in binaryData is as missing as any other.
        CONFIG_MAP: {"data": {"k": "plain"}, "binaryData": {"b": base64.b64encode(b"bin").decode()}},
    })
    refs = [ref("secretKeyRef", "s"), ref("configMapKeyRef", "c"), ref("configMapKeyRef", "gone", optional=True)]
    pod = worker(client, tmp_path, refs)
    sources = asyncio.run(pod._sources(env.referenced(pod.pod["spec"]["containers"])))
    assert sources == {("Secret", "s"): {"k": "hush"}, ("ConfigMap", "c"): {"k": "plain"}}
    assert sorted(client.gets) == [CONFIG_MAP, "/api/v1/namespaces/ns/configmaps/gone", SECRET]
    assert env.container_env(pod.pod, {"env": refs}, sources) == {"secretKeyRef-s-k": "hush",
                                                                   "configMapKeyRef-c-k": "plain"}
    with pytest.raises(env.MissingKey, match="couldn't find key b in ConfigMap ns/c"):
        env.container_env(pod.pod, {"env": [ref("configMapKeyRef", "c", "b")]}, sources)


@pytest.mark.parametrize("path", [SECRET, CONFIG_MAP])
def test_a_read_that_fails_otherwise_is_retried_not_given_up(tmp_path: Path, path: str) -> None:
    pod = worker(FakeClient({path: 403}), tmp_path, [])
    kind, name = ("Secret", "s") if path == SECRET else ("ConfigMap", "c")
    with pytest.raises(Refused, match=f"cannot read {kind} {name}: HTTP 403") as refused:
        asyncio.run(pod._sources({(kind, name)}))
    assert refused.value.retry
