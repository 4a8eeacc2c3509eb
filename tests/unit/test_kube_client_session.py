"""The operator's API client reads the environment's proxy settings once, not in a thread per request."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client as k8s

from pdfleet.operator.kube.kube_client import KubeClient


def configuration(host: str) -> k8s.Configuration:
    cfg = k8s.Configuration()
    cfg.host = host
    return cfg


@pytest.mark.parametrize(("no_proxy", "expected"), [("", "http://127.0.0.9:3128"), ("127.0.0.1", None)])
async def test_the_proxy_from_the_environment_is_settled_once_and_the_session_no_longer_looks_it_up(
        monkeypatch: pytest.MonkeyPatch, no_proxy: str, expected: str | None) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.9:3128")
    if no_proxy:
        monkeypatch.setenv("NO_PROXY", no_proxy)
    cfg = configuration("https://127.0.0.1:6443")

    client = KubeClient(cfg)
    try:
        assert cfg.proxy == expected
        assert client._api.rest_client.pool_manager.trust_env is False
    finally:
        await client.close()
