"""A pool's name must fit every name and label value the operator derives from it: a pool named at the limit
renders only objects Kubernetes accepts, one character more is refused (by the same rule the CRD carries), and the
limit is tight (a name one longer would really break a derived name), so it follows the rendering code."""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from typing import Any

import pytest

from pdfleet.operator.api import names
from pdfleet.operator.api.checks import validate
from pdfleet.operator.api.roles import Role, RoleSpec
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.planning.health import restarts
from pdfleet.operator.render import desired, engine_group, revision
from pdfleet.operator.render.context import RenderContext
from pdfleet.operator.render.engine_group import GroupId
from tests.support.pools import pool_body

Body = dict[str, Any]

# Kubernetes' own validation (k8s.io/apimachinery/pkg/util/validation).
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")

# Kubernetes' naming rule for an object's own name, by kind (Services are DNS-1035 labels; the rest subdomains).
NAME_RULES = {"Service": (DNS_1035_LABEL, 63)}
SUBDOMAIN = (DNS_1123_SUBDOMAIN, 253)


def widest_spec() -> InferencePoolSpec:
    """Both roles at the API's maximum of nodes per group (so the largest node rank)."""
    nodes = names.maximum(RoleSpec, "nodes_per_group")
    body = pool_body(prefill__nodesPerGroup=nodes, prefill__tp=nodes, prefill__gpusPerNode=1,
                     decode__nodesPerGroup=nodes, decode__tp=nodes, decode__gpusPerNode=1)
    return InferencePoolSpec.model_validate(body["spec"])


def derived_objects(pool: str) -> list[Body]:
    """Every kind of object the operator makes for `pool`, and the pods of each role's last group at the largest
    group index and node rank the API allows, and an evidence ConfigMap of such a group."""
    ctx = RenderContext(pool=pool, namespace="ns", uid="u1")
    spec = widest_spec()
    last = names.maximum(RoleSpec, "replicas") - 1
    objects = desired.desired(ctx, spec).objects()  # the router's, the Services, the first groups' pods
    for role in Role:
        gid = GroupId(role, last)
        objects += [engine_group.engine_pod(ctx, spec, gid, rank, revision.role_revision(spec, role))
                    for rank in range(spec.role(role).nodes_per_group)]
        # Evidence bundles are numbered on: a million of one group's is far more than will ever be kept.
        # Their labels hold the pool's and the group's names, as the group's own objects' labels do.
        objects.append({"kind": "ConfigMap", "metadata": {"name": restarts.evidence_name(gid.name(pool), 10**6)}})
    return objects


def label_maps(node: Any, key: str = "") -> Iterator[tuple[str, dict[str, str]]]:
    """Every label set in an object: labels, matchLabels and a Service's selector, however deep."""
    if isinstance(node, dict):
        if key in ("labels", "matchLabels") or (key == "selector" and all(isinstance(v, str) for v in node.values())):
            yield key, node
        for k, v in node.items():
            yield from label_maps(v, k)
    elif isinstance(node, list):
        for item in node:
            yield from label_maps(item, key)


def misfits(pool: str) -> list[str]:
    """Each derived name or label value Kubernetes would refuse, said why."""
    out = []

    def check(what: str, value: str, pattern: re.Pattern[str], limit: int) -> None:
        if len(value) > limit or not pattern.fullmatch(value):
            out.append(f"{what} {value!r} ({len(value)} characters, at most {limit})")

    for obj in derived_objects(pool):
        name = obj["metadata"]["name"]
        check(f"{obj['kind']} name", name, *NAME_RULES.get(obj["kind"], SUBDOMAIN))
        if obj["kind"] == "Pod":
            check("pod hostname", obj["spec"]["hostname"], DNS_1123_LABEL, 63)
            check("pod subdomain", obj["spec"]["subdomain"], DNS_1123_LABEL, 63)
        for where, labels in label_maps(obj):
            for k, v in labels.items():
                check(f"{obj['kind']} {name} {where}[{k}]", v, LABEL_VALUE, 63)
    return out


def test_the_limit_is_what_the_longest_derived_name_leaves_of_a_dns_label() -> None:
    assert names.MAX_LENGTH == 63 - len("-prefill-1023-63") == 47


def test_a_pool_named_at_the_limit_derives_only_names_kubernetes_accepts() -> None:
    pool = "p" * names.MAX_LENGTH
    assert misfits(pool) == []
    assert validate({"metadata": {"name": pool}, "spec": pool_body()["spec"]}) == []


def test_the_limit_is_tight_one_more_character_breaks_a_derived_name() -> None:
    broken = misfits("p" * (names.MAX_LENGTH + 1))
    assert any("pod hostname" in m for m in broken), broken


@pytest.mark.parametrize("name", ["p" * (names.MAX_LENGTH + 1), "p" * 60])
def test_a_longer_name_is_refused_naming_metadata_name_and_the_limit(name: str) -> None:
    problems = validate({"metadata": {"name": name}, "spec": pool_body()["spec"]})
    assert [p.path for p in problems] == ["metadata.name"]
    assert f"at most {names.MAX_LENGTH} characters" in str(problems[0])
    assert str(problems[0]).startswith("metadata.name: ")


@pytest.mark.parametrize("name", ["1pool", "my.pool"])
def test_a_name_a_service_cannot_take_is_refused(name: str) -> None:
    assert misfits(name), "a Service named after it would be refused"
    problems = validate({"metadata": {"name": name}, "spec": pool_body()["spec"]})
    assert [p.path for p in problems] == ["metadata.name"]
    assert "DNS-1035" in problems[0].message


def test_the_crd_carries_the_same_rules_at_its_root_on_create_only() -> None:
    from pdfleet.operator.api import crd

    rules = crd.openapi_schema()["x-kubernetes-validations"]
    messages = {r["message"] for r in rules}
    for rule in names.RULES:
        assert rule.message in messages
    for r in rules:
        assert r["optionalOldSelf"] is True and r["rule"].startswith("oldSelf.hasValue() || ")
    length = next(r for r in rules if "size()" in r["rule"])
    assert length["rule"].endswith(f"<= {names.MAX_LENGTH}")
    assert "metadata.name" in length["message"] and str(names.MAX_LENGTH) in length["message"]


def test_the_operator_refuses_a_pool_created_before_the_rule_with_the_same_message() -> None:
    from pdfleet.operator.cache import Observed
    from pdfleet.operator.planning import reconcile

    pool = pool_body(name="p" * 60)
    plan = reconcile.plan(pool, Observed(pool=pool, owned={}), now=datetime.datetime(2026, 12, 3, tzinfo=datetime.UTC))
    assert plan.rejected and plan.apply == ()
    accepted = next(c for c in plan.status["conditions"] if c["type"] == "Accepted")
    assert accepted["status"] == "False"
    assert names.LENGTH_RULE.message in accepted["message"]
