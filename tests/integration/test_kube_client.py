"""The operator's Kubernetes client against the real apiserver: apply, delete, errors, and counting."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pdfleet.operator import metrics
from pdfleet.operator.kube.kube_client import FIELD_MANAGER, KubeClient, KubeError, load_configuration
from tests.support.cluster import Cluster

pytestmark = pytest.mark.cluster


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[KubeClient]:
    kube = KubeClient(await load_configuration(str(cluster.kubeconfig)))
    yield kube
    await kube.close()


def configmap(namespace: str, data: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": namespace},
            "data": data}


def count(verb: str, resource: str, code: str) -> float:
    return metrics.REGISTRY.get_sample_value(
        "pdfleet_kube_requests_total", {"verb": verb, "resource": resource, "code": code}) or 0.0


async def test_apply_creates_then_updates_with_pdfleets_field_manager(
    client: KubeClient, cluster: Cluster, namespace: str
) -> None:
    before = count("PATCH", "configmaps", "200") + count("PATCH", "configmaps", "201")
    await client.apply(configmap(namespace, {"a": "1"}))
    updated = await client.apply(configmap(namespace, {"a": "2"}))
    assert updated["data"] == {"a": "2"}
    managers = {m["manager"] for m in cluster.get("configmap", "cm", "-n", namespace,
                                                 "--show-managed-fields")["metadata"]["managedFields"]}
    assert managers == {FIELD_MANAGER}
    assert count("PATCH", "configmaps", "200") + count("PATCH", "configmaps", "201") == before + 2


async def test_delete_with_a_stale_uid_leaves_the_successor_alone(client: KubeClient, cluster: Cluster,
                                                                  namespace: str) -> None:
    first = await client.apply(configmap(namespace, {"a": "1"}))
    await client.delete("v1", "ConfigMap", namespace, "cm", uid=first["metadata"]["uid"])
    await client.apply(configmap(namespace, {"a": "successor"}))
    with pytest.raises(KubeError) as err:
        await client.delete("v1", "ConfigMap", namespace, "cm", uid=first["metadata"]["uid"])
    assert err.value.conflict
    assert cluster.get("configmap", "cm", "-n", namespace)["data"] == {"a": "successor"}


async def test_deleting_what_is_already_gone_is_success(client: KubeClient, namespace: str) -> None:
    await client.delete("v1", "ConfigMap", namespace, "never-existed")


async def test_an_invalid_object_is_reported_with_the_apiservers_message(client: KubeClient, namespace: str) -> None:
    bad = configmap(namespace, {"not a valid key!": "x"})
    with pytest.raises(KubeError) as err:
        await client.apply(bad)
    assert err.value.status == 422
    assert "not a valid key!" in err.value.message
