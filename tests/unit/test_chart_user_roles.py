"""The chart's ClusterRoles for people: `-view` reads pools and their roles, `-edit` also writes pools and scales
roles; `-view` joins the built-in view/edit/admin roles by default, `-edit` only when asked (writing a pool starts GPU
engines: an admin grants it deliberately). tests/integration/test_chart_user_roles.py asks the real apiserver."""

from __future__ import annotations

from typing import Any

from tests.unit.test_chart import RELEASE, RELEASE_NS, documents, of_kind, rule_table, template

NAME = f"{RELEASE}-{RELEASE_NS}"
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def user_roles(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in of_kind(documents(template(values).stdout), "ClusterRole")
            if r["metadata"]["name"] in (f"{NAME}-view", f"{NAME}-edit")}


def aggregated_into(role: dict[str, Any]) -> set[str]:
    return {k.removeprefix(AGGREGATE) for k, v in role["metadata"]["labels"].items() if k.startswith(AGGREGATE)
            and v == "true"}


def test_view_reads_and_edit_writes_pools_and_scales_roles_and_nothing_else() -> None:
    roles = user_roles({})
    view, edit = rule_table(roles[f"{NAME}-view"]), rule_table(roles[f"{NAME}-edit"])
    reads = frozenset({"get", "list", "watch"})
    assert set(view.values()) == {reads} and {g for g, _ in view} == {"pdfleet.dev"}
    assert edit[("pdfleet.dev", "inferencepools")] == reads | {"create", "update", "patch", "delete",
                                                                "deletecollection"}
    assert edit[("pdfleet.dev", "inferencepoolroles")] == reads, "the operator creates and deletes a pool's roles"
    assert edit[("pdfleet.dev", "inferencepoolroles/scale")] == {"get", "update", "patch"}
    assert {g for g, _ in edit} == {"pdfleet.dev"}, "pods, Services and Secrets stay with the built-in roles"


def test_view_joins_the_built_in_roles_and_edit_only_when_asked() -> None:
    roles = user_roles({})
    assert aggregated_into(roles[f"{NAME}-view"]) == {"view", "edit", "admin"}
    assert aggregated_into(roles[f"{NAME}-edit"]) == set()
    asked = user_roles({"rbac": {"userRoles": {"aggregateToEdit": True, "aggregateToView": False}}})
    assert aggregated_into(asked[f"{NAME}-edit"]) == {"edit", "admin"}
    assert aggregated_into(asked[f"{NAME}-view"]) == set()
    assert user_roles({"rbac": {"userRoles": {"create": False}}}) == {}
