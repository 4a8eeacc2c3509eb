"""The pool's NetworkPolicies (ingress only; plain networking.k8s.io/v1, with `endPort`, stable since 1.25).

- Engines: their HTTP and bootstrap ports from the pool's routers, its engines and the operator; every other
  port but the rank-health agent's from the pool's engines (NCCL and KV transfers pick ports at run time); the
  agent port from the operator only; the metrics-only port from `metricsFrom` (default: the pool's namespace, as
  for the router's metrics) and the operator; the HTTP port also from `engineFrom`, and, in a pool without a
  router, from `routerFrom` (clients then talk to the engines).
- Router: its client and metrics ports from `routerFrom` (default: the pool's namespace); its client port,
  which also serves the worker API, and its metrics port (what it saw of each engine, which a bake reads) from
  the operator.

The operator is named by its namespace and pod labels (the chart passes both). Egress is not restricted:
engines reach the model store, the apiserver is reached by the router, and DNS by all.
"""

from __future__ import annotations

from typing import Any

from pdfleet.operator.api.network import Peer
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.render import labels
from pdfleet.operator.render.context import RenderContext
from pdfleet.operator.render.engine_group import AGENT_PORT
from pdfleet.operator.render.engine_group import METRICS_PORT as ENGINE_METRICS_PORT
from pdfleet.operator.render.router_objects import COMPONENT as ROUTER_COMPONENT
from pdfleet.operator.render.router_objects import METRICS_PORT

Body = dict[str, Any]
MAX_PORT = 65535


def enabled(ctx: RenderContext, spec: InferencePoolSpec) -> bool:
    wanted = spec.network_policy.enabled
    return ctx.network_policies if wanted is None else wanted


def _engines(pool: str) -> Body:
    return {"matchLabels": labels.selector(pool),
            "matchExpressions": [{"key": labels.ROLE, "operator": "Exists"}]}


def _routers(pool: str) -> Body:
    return {"matchLabels": labels.selector(pool, **{labels.COMPONENT: ROUTER_COMPONENT})}


def _operator(ctx: RenderContext) -> Body:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ctx.operator_namespace}},
            "podSelector": {"matchLabels": dict(ctx.operator_labels)}}


def _peers(peers: list[Peer]) -> list[Body]:
    return [p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in peers]


def _tcp(*ports: int) -> list[Body]:
    return [{"protocol": "TCP", "port": p} for p in sorted(set(ports))]


def _all_but(port: int) -> list[Body]:
    return [{"protocol": "TCP", "port": 1, "endPort": port - 1},
            {"protocol": "TCP", "port": port + 1, "endPort": MAX_PORT}]


def _namespace_unless(peers: list[Peer] | None) -> list[Body]:
    """`peers`, or, unset, every pod of the pool's namespace (a policy's own namespace: `podSelector: {}`)."""
    return [{"podSelector": {}}] if peers is None else _peers(peers)


def _router_from(spec: InferencePoolSpec) -> list[Body]:
    """Who may reach the router (or, without one, the engines' HTTP port): by default the pool's namespace."""
    return _namespace_unless(spec.network_policy.router_from)


def network_policies(ctx: RenderContext, spec: InferencePoolSpec) -> list[Body]:
    if not enabled(ctx, spec):
        return []
    common = labels.common(ctx.pool, "network-policy")
    http = [spec.role(r).port for r in Role]
    serving = _tcp(*http, *(spec.role(r).bootstrap_port for r in Role if r is Role.PREFILL))
    engine_rules: list[Body] = [
        {"from": [{"podSelector": _routers(ctx.pool)}, _operator(ctx)], "ports": serving},
        {"from": [{"podSelector": _engines(ctx.pool)}], "ports": _all_but(AGENT_PORT)},
        {"from": [_operator(ctx)], "ports": _tcp(AGENT_PORT)},
    ]
    # Metrics only, for a Prometheus (and the HPA or KEDA it feeds): nothing else of the engine is behind this port.
    scrapers = [*_namespace_unless(spec.network_policy.metrics_from), _operator(ctx)]
    engine_rules.append({"from": scrapers, "ports": _tcp(ENGINE_METRICS_PORT)})
    clients = _peers(spec.network_policy.engine_from)
    if spec.router.replicas == 0:
        clients += _router_from(spec)
    if clients:
        engine_rules.append({"from": clients, "ports": _tcp(*http)})
    policies = [{
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": ctx.metadata(f"{ctx.pool}-engines", common),
        "spec": {"podSelector": _engines(ctx.pool), "policyTypes": ["Ingress"], "ingress": engine_rules},
    }]
    if spec.router.replicas:
        router_rules: list[Body] = [{"from": [_operator(ctx)], "ports": _tcp(spec.router.port, METRICS_PORT)}]
        if users := _router_from(spec):
            router_rules.insert(0, {"from": users, "ports": _tcp(spec.router.port, METRICS_PORT)})
        policies.append({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": ctx.metadata(f"{ctx.pool}-router", common),
            "spec": {"podSelector": _routers(ctx.pool), "policyTypes": ["Ingress"], "ingress": router_rules},
        })
    return policies
