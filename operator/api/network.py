"""`spec.networkPolicy`: which peers may reach the pool's pods, as plain `networking.k8s.io/v1` NetworkPolicies
(docs/security.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule

_SELECTOR = {"x-kubernetes-preserve-unknown-fields": True}

_ONE_OF = Rule(
    cel="has(self.podSelector) || has(self.namespaceSelector) || has(self.ipBlock)",
    holds=lambda p: p.pod_selector is not None or p.namespace_selector is not None or p.ip_block is not None,
    message="a peer needs podSelector, namespaceSelector or ipBlock",
)


class Peer(ApiModel):
    """A networking.k8s.io/v1 NetworkPolicyPeer, passed to the policy unchanged."""

    RULES = (_ONE_OF,)

    pod_selector: dict[str, Any] | None = Field(
        default=None, description="A LabelSelector of pods (in the pool's namespace unless namespaceSelector is "
        "set too).", json_schema_extra=_SELECTOR)
    namespace_selector: dict[str, Any] | None = Field(
        default=None, description="A LabelSelector of namespaces ({} is every namespace).",
        json_schema_extra=_SELECTOR)
    ip_block: dict[str, Any] | None = Field(
        default=None, description="An IPBlock: cidr and except.", json_schema_extra=_SELECTOR)


class NetworkPolicySpec(ApiModel):
    """NetworkPolicies of the pool. Engines' serving, bootstrap and KV ports open to the pool's routers and engines
    and to the operator; the rank-health agent to the operator only; the engines' metrics-only port to
    `metricsFrom`; the router to `routerFrom`."""

    enabled: bool | None = Field(
        default=None, description="Render the pool's NetworkPolicies. Unset: the operator's default "
        "(the chart's networkPolicy.enabled, on unless switched off).")
    router_from: list[Peer] | None = Field(
        default=None, max_length=32, description="Who may reach the router's client and metrics ports. Unset: "
        "every pod of the pool's namespace. [] shuts them to everyone.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"})
    engine_from: list[Peer] = Field(
        default_factory=list, max_length=32, description="Who else may reach the engines' HTTP port: SGLang's "
        "whole API, its admin endpoints included (a client of engines without a router, say). For engine metrics "
        "use metricsFrom, which opens only /metrics. Never the rank-health agent's.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"})
    metrics_from: list[Peer] | None = Field(
        default=None, max_length=32, description="Who may reach the engines' metrics port (container port "
        "`metrics`), which serves the engine's Prometheus /metrics and nothing else. Unset: every pod of "
        "the pool's namespace. [] leaves it to the operator (and the pool's own engines, which reach each other on "
        "every port). A Prometheus in another namespace must be named here (namespaceSelector and podSelector).",
        json_schema_extra={"x-kubernetes-list-type": "atomic"})
