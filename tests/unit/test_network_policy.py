"""The pool's NetworkPolicies: who may reach which port of its engines and router (docs/security.md).

A policy is judged here by evaluating it, the way a CNI would: `admits(policies, pod, peer, port)` answers
whether a connection from `peer` to `port` of `pod` is let in. The rendered objects are checked against the
real apiserver, and their selectors against real pods, in tests/integration/test_router_security_e2e.py.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from typing import Any

import pytest

from pdfleet.operator.render import desired, labels
from pdfleet.operator.render.context import RenderContext
from pdfleet.operator.render.engine_group import AGENT_PORT
from pdfleet.operator.render.engine_group import METRICS_PORT as ENGINE_METRICS
from pdfleet.operator.render.router_objects import METRICS_PORT
from tests.unit.test_render import CTX, spec_of

Body = dict[str, Any]
OPERATOR_NS = CTX.operator_namespace


@dataclasses.dataclass(frozen=True)
class Peer:
    namespace: str
    labels: Mapping[str, str]
    ip: str = "10.0.0.1"


def _selects(selector: Body, found: Mapping[str, str]) -> bool:
    if any(found.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        present = expr["key"] in found
        if expr["operator"] == "Exists" and not present:
            return False
        if expr["operator"] == "In" and found.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _peer_matches(rule_peer: Body, peer: Peer, policy_ns: str) -> bool:
    if "ipBlock" in rule_peer:
        block = rule_peer["ipBlock"]
        ip = ipaddress.ip_address(peer.ip)
        return ip in ipaddress.ip_network(block["cidr"]) and \
            not any(ip in ipaddress.ip_network(e) for e in block.get("except") or [])
    ns_labels = {"kubernetes.io/metadata.name": peer.namespace}
    if "namespaceSelector" in rule_peer:
        if not _selects(rule_peer["namespaceSelector"], ns_labels):
            return False
    elif peer.namespace != policy_ns:
        return False
    return "podSelector" not in rule_peer or _selects(rule_peer["podSelector"], peer.labels)


def _port_matches(rule_port: Body, port: int) -> bool:
    low = rule_port["port"]
    return low <= port <= rule_port.get("endPort", low)


def admits(policies: list[Body], pod_labels: Mapping[str, str], peer: Peer, port: int) -> bool:
    """Ingress to a pod of the pool's namespace: open if no policy selects the pod, else if a rule admits it."""
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], pod_labels)]
    if not selecting:
        return True
    return any(_peer_matches(f, peer, p["metadata"]["namespace"]) and any(_port_matches(q, port) for q in r["ports"])
               for p in selecting for r in p["spec"]["ingress"] for f in r["from"])


def policies(ctx: RenderContext = CTX, **updates: Any) -> list[Body]:
    return list(desired.desired(ctx, spec_of(**updates)).policies)


POOL = CTX.pool
ENGINE = {**labels.common(POOL, "decode-engine"), labels.ROLE: "decode"}
ROUTER = labels.common(POOL, "router")
OPERATOR = Peer(OPERATOR_NS, dict(CTX.operator_labels))
ROUTER_PEER = Peer("ns", ROUTER)
ENGINE_PEER = Peer("ns", {**labels.common(POOL, "prefill-engine"), labels.ROLE: "prefill"})
NEIGHBOUR = Peer("ns", {"app": "some-client"})  # another pod of the pool's namespace
STRANGER = Peer("elsewhere", {"app": "some-client"})
OTHER_POOL_ENGINE = Peer("ns", {**labels.common("other", "decode-engine"), labels.ROLE: "decode"})
HTTP, BOOTSTRAP, ROUTER_PORT, NCCL = 30000, 8998, 30000, 41234


@pytest.mark.effect("spec.networkPolicy.enabled")
def test_engines_admit_their_pool_and_the_operator_and_the_agent_only_the_operator() -> None:
    rendered = policies()
    assert sorted(p["metadata"]["name"] for p in rendered) == [f"{POOL}-engines", f"{POOL}-router"]
    spec = spec_of()
    http, bootstrap = spec.decode.port, spec.prefill.bootstrap_port
    for peer in (ROUTER_PEER, ENGINE_PEER, OPERATOR):
        assert admits(rendered, ENGINE, peer, http) and admits(rendered, ENGINE, peer, bootstrap)
    assert admits(rendered, ENGINE, ENGINE_PEER, NCCL), "engines of a group talk on ports picked at run time"
    assert admits(rendered, ENGINE, OPERATOR, AGENT_PORT)
    for peer in (ROUTER_PEER, ENGINE_PEER, NEIGHBOUR, STRANGER, OTHER_POOL_ENGINE):
        assert not admits(rendered, ENGINE, peer, AGENT_PORT), peer
    for peer in (NEIGHBOUR, STRANGER, OTHER_POOL_ENGINE):
        assert not admits(rendered, ENGINE, peer, http), peer
        assert not admits(rendered, ENGINE, peer, NCCL), peer
    # The router: its namespace by default, the operator for its worker API and metrics; nobody else.
    assert admits(rendered, ROUTER, NEIGHBOUR, ROUTER_PORT) and admits(rendered, ROUTER, NEIGHBOUR, METRICS_PORT)
    assert admits(rendered, ROUTER, OPERATOR, ROUTER_PORT) and admits(rendered, ROUTER, OPERATOR, METRICS_PORT)
    assert not admits(rendered, ROUTER, STRANGER, ROUTER_PORT)
    assert not admits(rendered, ROUTER, STRANGER, METRICS_PORT)

    assert policies(networkPolicy={"enabled": False}) == []
    assert policies(dataclasses.replace(CTX, network_policies=False)) == []
    assert len(policies(dataclasses.replace(CTX, network_policies=False), networkPolicy={"enabled": True})) == 2


@pytest.mark.effect("spec.networkPolicy.routerFrom.podSelector", "spec.networkPolicy.routerFrom.namespaceSelector",
                    "spec.networkPolicy.routerFrom.ipBlock")
def test_router_from_names_who_may_reach_the_router() -> None:
    gateway = Peer("gateway", {"app": "envoy"})
    rendered = policies(networkPolicy={"routerFrom": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}},
         "podSelector": {"matchLabels": {"app": "envoy"}}},
        {"ipBlock": {"cidr": "192.168.7.0/24"}}]})
    assert admits(rendered, ROUTER, gateway, ROUTER_PORT)
    assert admits(rendered, ROUTER, Peer("x", {}, ip="192.168.7.9"), ROUTER_PORT)
    assert not admits(rendered, ROUTER, NEIGHBOUR, ROUTER_PORT), "the default (the namespace) is replaced"
    assert admits(rendered, ROUTER, OPERATOR, ROUTER_PORT)
    shut = policies(networkPolicy={"routerFrom": []})
    assert not admits(shut, ROUTER, NEIGHBOUR, ROUTER_PORT) and admits(shut, ROUTER, OPERATOR, ROUTER_PORT)
    # Without a router, clients talk to the engines: routerFrom then opens their HTTP port, not the agent's.
    direct = policies(router__replicas=0, networkPolicy={"routerFrom": [{"podSelector": {"matchLabels": {
        "app": "some-client"}}}]})
    assert [p["metadata"]["name"] for p in direct] == [f"{POOL}-engines"]
    assert admits(direct, ENGINE, NEIGHBOUR, HTTP) and not admits(direct, ENGINE, NEIGHBOUR, AGENT_PORT)


@pytest.mark.effect("spec.networkPolicy.engineFrom.podSelector", "spec.networkPolicy.engineFrom.namespaceSelector",
                    "spec.networkPolicy.engineFrom.ipBlock")
def test_engine_from_opens_the_engines_http_port_and_nothing_else() -> None:
    prometheus = Peer("monitoring", {"app": "prometheus"})
    rendered = policies(networkPolicy={"engineFrom": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
         "podSelector": {"matchLabels": {"app": "prometheus"}}},
        {"ipBlock": {"cidr": "192.168.8.0/24"}}]})
    assert admits(rendered, ENGINE, prometheus, HTTP)
    assert admits(rendered, ENGINE, Peer("x", {}, ip="192.168.8.3"), HTTP)
    assert not admits(rendered, ENGINE, prometheus, AGENT_PORT)
    assert not admits(rendered, ENGINE, prometheus, BOOTSTRAP)


PROMETHEUS = Peer("monitoring", {"app.kubernetes.io/name": "prometheus"})
IN_MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}


def test_the_engines_metrics_port_admits_the_pools_namespace_and_the_operator_by_default() -> None:
    rendered = policies()
    for peer in (NEIGHBOUR, ROUTER_PEER, ENGINE_PEER, OPERATOR):
        assert admits(rendered, ENGINE, peer, ENGINE_METRICS), peer
    assert not admits(rendered, ENGINE, STRANGER, ENGINE_METRICS)
    assert not admits(rendered, ENGINE, PROMETHEUS, ENGINE_METRICS), "a Prometheus elsewhere must be named"
    # Whoever the metrics port admits gets nothing else of the engine: not its API, agent or bootstrap port.
    for port in (HTTP, AGENT_PORT, BOOTSTRAP, NCCL):
        assert not admits(rendered, ENGINE, NEIGHBOUR, port), port


@pytest.mark.effect("spec.networkPolicy.metricsFrom.podSelector", "spec.networkPolicy.metricsFrom.namespaceSelector",
                    "spec.networkPolicy.metricsFrom.ipBlock")
def test_metrics_from_names_who_may_scrape_the_engines_and_opens_nothing_else() -> None:
    rendered = policies(networkPolicy={"metricsFrom": [IN_MONITORING, {"ipBlock": {"cidr": "192.168.9.0/24"}}]})
    assert admits(rendered, ENGINE, PROMETHEUS, ENGINE_METRICS)
    assert admits(rendered, ENGINE, Peer("x", {}, ip="192.168.9.4"), ENGINE_METRICS)
    assert not admits(rendered, ENGINE, NEIGHBOUR, ENGINE_METRICS), "the default (the namespace) is replaced"
    assert not admits(rendered, ENGINE, Peer("monitoring", {"app": "grafana"}), ENGINE_METRICS)
    assert admits(rendered, ENGINE, OPERATOR, ENGINE_METRICS)
    for port in (HTTP, AGENT_PORT, BOOTSTRAP, NCCL):
        assert not admits(rendered, ENGINE, PROMETHEUS, port), port
    # The router's ports are routerFrom's: metricsFrom changes nothing there.
    assert not admits(rendered, ROUTER, PROMETHEUS, METRICS_PORT)
    assert admits(rendered, ROUTER, NEIGHBOUR, METRICS_PORT)

    shut = policies(networkPolicy={"metricsFrom": []})
    for peer in (NEIGHBOUR, PROMETHEUS, STRANGER):
        assert not admits(shut, ENGINE, peer, ENGINE_METRICS), peer
    assert admits(shut, ENGINE, OPERATOR, ENGINE_METRICS)
    assert admits(shut, ENGINE, ENGINE_PEER, ENGINE_METRICS), "the pool's engines reach each other on every port"


def test_engine_from_and_metrics_from_are_independent() -> None:
    """engineFrom still opens the whole HTTP port, and does not stand in for metricsFrom, nor metricsFrom for it."""
    rendered = policies(networkPolicy={"engineFrom": [IN_MONITORING], "metricsFrom": []})
    assert admits(rendered, ENGINE, PROMETHEUS, HTTP) and not admits(rendered, ENGINE, PROMETHEUS, ENGINE_METRICS)


def test_the_operator_is_named_by_the_namespace_and_labels_it_was_given() -> None:
    ctx = dataclasses.replace(CTX, operator_namespace="ops", operator_labels=(("app", "pdfleet-operator"),))
    rendered = policies(ctx)
    assert admits(rendered, ENGINE, Peer("ops", {"app": "pdfleet-operator"}), AGENT_PORT)
    assert not admits(rendered, ENGINE, OPERATOR, AGENT_PORT), "the default identity no longer applies"


def test_a_peer_without_a_selector_is_refused_at_validation() -> None:
    with pytest.raises(ValueError, match="podSelector, namespaceSelector or ipBlock"):
        spec_of(networkPolicy={"routerFrom": [{}]})
