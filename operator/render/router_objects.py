"""The pool's PD router: the real sglang-router in PD mode, finding engines by Kubernetes service discovery.

Discovery (not a static worker list) means scaling the pool never restarts the router: it watches the
pool's engine pods by label and adds or drops workers as they come and go. That needs `pods` get/list/watch in
the pool's namespace, granted to the router's own ServiceAccount by a Role the operator creates.

The router's control plane (`/workers`, `/flush_cache`, `/get_loads`, ...) is shut to everyone but the operator:
the router runs with one admin control-plane key, taken from the pool's router-key Secret into an environment
variable that its args refer to as `$(VAR)` (so no pod spec, Deployment or Event holds the key), and with
sglang-router's audit log of control-plane calls on. Client traffic (`/generate`, `/v1/...`) needs no key.
"""

from __future__ import annotations

import math
from typing import Any

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.router import CircuitBreaker
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.render import labels, pod_security, router_secret
from pdfleet.operator.render.context import RenderContext
from pdfleet.operator.render.engine_group import RUNTIME_MOUNT

Body = dict[str, Any]
METRICS_PORT = 29000
READY_PORT = 29001  # the readiness sidecar of a router with circuit breakers (runtime/router_ready.py)
COMPONENT = "router"
# A terminating router pod keeps serving this long before SIGTERM: Services, proxies and gateways take a moment
# to stop sending it new requests, and those in flight finish (a key rotation rolls the routers).
DRAIN_S = 5
STARTUP_S = 300  # how long a router may take to start listening before it is restarted


def router_name(pool: str) -> str:
    return f"{pool}-router"


def _selector_args(ctx: RenderContext, role: Role) -> list[str]:
    # Node rank 0 only: the other pods of a multi-node group serve no API (SGLang runs its HTTP server on the
    # first node), and the router would send requests to them.
    selector = labels.selector(ctx.pool, **{labels.ROLE: str(role), labels.RANK: "0"})
    return [f"{k}={v}" for k, v in selector.items()]


def router_args(ctx: RenderContext, spec: InferencePoolSpec) -> list[str]:
    router = spec.router
    return [
        "--pd-disaggregation",
        "--host", "0.0.0.0",
        "--port", str(router.port),
        "--prefill-policy", str(router.prefill_policy),
        "--decode-policy", str(router.decode_policy),
        "--service-discovery",
        "--service-discovery-namespace", ctx.namespace,
        "--service-discovery-port", str(spec.decode.port),
        "--prefill-selector", *_selector_args(ctx, Role.PREFILL),
        "--decode-selector", *_selector_args(ctx, Role.DECODE),
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(METRICS_PORT),
        # id:name:role:key; the id is what the audit log names as the caller.
        "--control-plane-api-keys", f"{router_secret.KEY_ID}:pdfleet operator:admin:$({router_secret.ENV})",
        "--control-plane-audit-enabled",
        *circuit_breaker_args(router.circuit_breaker),
    ]


def _seconds(duration: str) -> str:
    """sglang-router takes whole seconds: a shorter duration is rounded up, never down to 0."""
    return str(max(1, math.ceil(parse_duration(duration).total_seconds())))


def circuit_breaker_args(breaker: CircuitBreaker) -> list[str]:
    if not breaker.enabled:
        return ["--disable-circuit-breaker"]
    return ["--cb-failure-threshold", str(breaker.failure_threshold),
            "--cb-window-duration-secs", _seconds(breaker.window),
            "--cb-timeout-duration-secs", _seconds(breaker.open_for)]


def _key_env(ctx: RenderContext) -> list[Body]:
    return [{"name": router_secret.ENV, "valueFrom": {"secretKeyRef": {
        "name": router_secret.secret_name(ctx.pool), "key": ctx.router_key}}}]


def router_objects(ctx: RenderContext, spec: InferencePoolSpec) -> list[Body]:
    if spec.router.replicas == 0:
        return []
    name = router_name(ctx.pool)
    common = labels.common(ctx.pool, COMPONENT)
    selector = labels.selector(ctx.pool, **{labels.COMPONENT: COMPONENT})
    router = spec.router
    image = router.image or spec.engine.image
    pod_spec: Body = {
        "serviceAccountName": name,
        "enableServiceLinks": False,
        "securityContext": pod_security.router_pod(),  # Pod Security's restricted (render/pod_security.py)
        "nodeSelector": dict(router.scheduling.node_selector),
        "tolerations": [t.model_dump(mode="json", by_alias=True) for t in router.scheduling.tolerations],
        "containers": [{
            "name": "router",
            "image": image,
            "imagePullPolicy": str(spec.engine.image_pull_policy),
            "command": ["python3", "-m", "sglang_router.launch_router"],
            "args": router_args(ctx, spec),
            # The spec's after the operator's, as on the engines: refused names keep them apart (api/router.py).
            "env": [*_key_env(ctx), *(e.to_container() for e in router.env)],
            "ports": [{"name": "http", "containerPort": router.port},
                      {"name": "metrics", "containerPort": METRICS_PORT}],
            # A router's start (its Python entry point, then the Rust server) took 40+ s on a busy node, and a
            # liveness probe alone killed it before it listened, again at every restart: a crash loop. Startup
            # allows it 5 minutes; liveness applies once it answers. Asked every 2 s, so the router's readiness
            # (it needs workers) is judged seconds after it can serve.
            "startupProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "periodSeconds": 2,
                             "failureThreshold": STARTUP_S // 2},
            "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, "periodSeconds": 10},
            "lifecycle": {"preStop": {"exec": {"command": ["python3", "-c", f"import time; time.sleep({DRAIN_S})"]}}},
            "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "periodSeconds": 20,
                              "failureThreshold": 3},
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
            "securityContext": pod_security.container(read_only_root=True),
            # Its root filesystem is read-only, and Python's tempfile (imported on the entry point's path) finds
            # no writable directory without one: the router exited at import in a real container.
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    if router.circuit_breaker.enabled:
        _add_ready_sidecar(ctx, pod_spec, image, router.port, str(spec.engine.image_pull_policy))
    if router.scheduling.affinity:
        pod_spec["affinity"] = router.scheduling.affinity
    elif router.replicas > 1:
        # One node's loss should not take every router: spread them, where the cluster has the nodes.
        pod_spec["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                               "labelSelector": {"matchLabels": selector}}}]}}
    if router.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = router.scheduling.priority_class_name
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": ctx.metadata(name, common),
         "automountServiceAccountToken": True},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": ctx.metadata(name, common),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": ctx.metadata(name, common),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": ctx.metadata(name, common),
         "spec": {
             "replicas": router.replicas,
             "selector": {"matchLabels": selector},
             "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
             "template": {"metadata": {"labels": common}, "spec": pod_spec},
         }},
        {"apiVersion": "v1", "kind": "Service", "metadata": ctx.metadata(name, common),
         "spec": {"selector": selector, "ports": [
             {"name": "http", "port": router.port, "targetPort": "http"},
             {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}]}},
        *_disruption_budget(ctx, name, common, selector, router.replicas),
    ]


def _add_ready_sidecar(ctx: RenderContext, pod_spec: Body, image: str, port: int, pull_policy: str) -> None:
    """sglang-router's `/readiness` needs a healthy worker of each role, which means "can route" while it runs no
    circuit breakers; with them, an open circuit is invisible to it. The sidecar's readiness sees them, and a pod
    is Ready only when all its containers are. It runs on the router's own image (it has Python), pdfleet's
    runtime copied in by the init container engine pods use."""
    pod_spec["initContainers"] = [{
        "name": "pdfleet-runtime",
        "image": ctx.runtime_image,
        "command": ["pdfleet-install-runtime", RUNTIME_MOUNT],
        "volumeMounts": [{"name": "pdfleet-runtime", "mountPath": RUNTIME_MOUNT}],
        "securityContext": pod_security.container(read_only_root=True),
    }]
    pod_spec["containers"].append({
        "name": "ready",
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": ["python3", "-m", "pdfleet.runtime.router_ready"],
        "args": ["--host", "$(POD_IP)", "--port", str(READY_PORT), "--address", "$(POD_IP)",
                 "--router-port", str(port), "--metrics-port", str(METRICS_PORT)],
        "env": [{"name": "PYTHONPATH", "value": f"{RUNTIME_MOUNT}/lib"},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                *_key_env(ctx)],
        "ports": [{"name": "ready", "containerPort": READY_PORT}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "ready"}, "periodSeconds": 2, "failureThreshold": 2},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": pod_security.container(read_only_root=True),
        "volumeMounts": [{"name": "pdfleet-runtime", "mountPath": RUNTIME_MOUNT, "readOnly": True}],
    })
    pod_spec["volumes"].append({"name": "pdfleet-runtime", "emptyDir": {"sizeLimit": "256Mi"}})


def _disruption_budget(ctx: RenderContext, name: str, common: dict[str, str], selector: dict[str, str],
                       replicas: int) -> list[Body]:
    """With more than one router, a drain or an eviction takes them one at a time (with one, a budget would
    block node drains for good)."""
    if replicas < 2:
        return []
    return [{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": ctx.metadata(name, common),
             "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}}}]
