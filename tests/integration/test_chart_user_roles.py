"""The chart's ClusterRoles for people, asked of the real apiserver (RBAC enforced, the built-in roles aggregated by
the real controller-manager): a user bound to `-edit` may write pools and scale their roles and nothing the operator
makes from them; `-view` and the built-in view role read pools; the built-in edit role does not write them."""

from __future__ import annotations

import pytest

from tests.support import scheduling
from tests.support.cluster import Cluster, wait_for
from tests.support.release import RELEASE_NAMESPACE

pytestmark = pytest.mark.cluster

BINDINGS = {"alice": "-edit", "bob": "-view", "carol": "view", "dave": "edit"}


def can(cluster: Cluster, namespace: str, user: str, verb: str, resource: str, subresource: str = "") -> bool:
    args = ["auth", "can-i", verb, resource, "-n", namespace, "--as", user]
    if subresource:
        args.append(f"--subresource={subresource}")
    return cluster.kubectl(*args, check=False).stdout.strip() == "yes"


def test_pool_authoring_is_granted_by_binding_edit_and_reading_comes_with_view(
        cluster: Cluster, chart: None, namespace: str, request: pytest.FixtureRequest) -> None:
    release = scheduling.shared_operator(scheduling.module_path(request.module.__file__)).release
    names = {r["metadata"]["name"]
             for r in cluster.get("clusterroles", "-l", f"app.kubernetes.io/instance={release}")["items"]}
    fullname = release if "pdfleet" in release else f"{release}-pdfleet"  # the chart's pdfleet.fullname
    own = f"{fullname}-{RELEASE_NAMESPACE}"
    assert {f"{own}-view", f"{own}-edit"} <= names, names
    for user, role in BINDINGS.items():
        ref = f"{own}{role}" if role.startswith("-") else role
        cluster.kubectl("create", "rolebinding", f"{user}-{ref}"[:63], "-n", namespace, f"--clusterrole={ref}",
                        f"--user={user}")

    assert can(cluster, namespace, "alice", "create", "inferencepools")
    assert can(cluster, namespace, "alice", "patch", "inferencepoolroles", "scale")
    assert not can(cluster, namespace, "alice", "create", "inferencepoolroles"), "the operator makes a pool's roles"
    assert not can(cluster, namespace, "alice", "create", "pods") and not can(cluster, namespace, "alice", "get",
                                                                              "secrets")
    assert can(cluster, namespace, "bob", "list", "inferencepools") and not can(cluster, namespace, "bob", "create",
                                                                                 "inferencepools")
    # The built-in roles, as the controller-manager aggregates them (a moment after the chart's roles appear).
    wait_for("the built-in view role to read pools", lambda: can(cluster, namespace, "carol", "get", "inferencepools"),
             timeout=60)
    assert can(cluster, namespace, "dave", "get", "inferencepools")
    assert not can(cluster, namespace, "dave", "create", "inferencepools"), "edit does not author pools by default"
    assert not can(cluster, namespace, "carol", "patch", "inferencepoolroles", "scale")
