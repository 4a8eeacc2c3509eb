"""An engine group's objects: its pods (one per node of the group) and the headless Service they meet on.

The engine container runs the user's SGLang image unchanged; pdfleet's runtime reaches it through an init
container that copies the runtime into a shared volume, and the launcher from that volume starts SGLang with
the pool's patches. Probes are cheap on purpose: SGLang's `/health` runs a generation (it is
`/health_generate`), so kubelet never calls it; rank health is the operator's job, from the rank agents.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pdfleet.operator.api import flags
from pdfleet.operator.api.model import ModelSource
from pdfleet.operator.api.roles import DEFAULT_DRAIN_SECONDS, PrefillSpec, Role, RoleSpec
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.transfer import TransferBackend
from pdfleet.operator.render import engine_args, gang, labels, layout, placement, pod_security
from pdfleet.operator.render.context import RenderContext
from pdfleet.operator.render.engine_args import Flag
from pdfleet.runtime import metrics_relay
from pdfleet.runtime.health import agent

Body = dict[str, Any]

AGENT_PORT = agent.DEFAULT_PORT  # the rank-health agent inside every engine pod
# The engine's GET /metrics and nothing else (runtime/metrics_relay.py): what a Prometheus may be let onto without
# being let onto the engine's API (spec.networkPolicy.metricsFrom).
METRICS_PORT = metrics_relay.DEFAULT_PORT
DIST_PORT = 5000  # torch.distributed rendezvous of a multi-node group (--dist-init-addr)
RUNTIME_MOUNT = "/opt/pdfleet"
MODEL_MOUNT = "/models"
# The pod's grace period beyond its preStop drain (`drainSeconds`): SGLang's own shutdown after SIGTERM. The
# default drain keeps the 180 s grace period and the preStop command pods always had, so no pod changes for it.
SHUTDOWN_SECONDS = 30
GPU_RESOURCE = "nvidia.com/gpu"


@dataclasses.dataclass(frozen=True)
class GroupId:
    role: Role
    index: int

    def name(self, pool: str) -> str:
        return f"{pool}-{self.role}-{self.index}"

    def pod_name(self, pool: str, node_rank: int) -> str:
        return f"{self.name(pool)}-{node_rank}"


def group_labels(ctx: RenderContext, group: GroupId, revision: str) -> dict[str, str]:
    return {
        **labels.common(ctx.pool, f"{group.role}-engine"),
        labels.ROLE: str(group.role),
        labels.GROUP: group.name(ctx.pool),
        labels.REVISION: revision,
    }


def service_name(pool: str, role: Role) -> str:
    return f"{pool}-{role}"


def headless_service(ctx: RenderContext, role: Role) -> Body:
    """Gives each engine pod of a role a stable DNS name (`<pod>.<pool>-<role>.<ns>.svc`) for rendezvous, before
    any pod is Ready: ranks must find each other to become Ready at all. One per role, not per group: pod names
    are unique within the pool, so one Service names every pod, and a burst of new pools writes 2 Services each,
    not one per group."""
    name = service_name(ctx.pool, role)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.metadata(name, {**labels.common(ctx.pool, f"{role}-engine"), labels.ROLE: str(role)}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": labels.selector(ctx.pool, **{labels.ROLE: str(role)}),
            "ports": [{"name": "dist", "port": DIST_PORT, "targetPort": DIST_PORT}],
        },
    }


def _model_volume(source: ModelSource) -> tuple[list[Body], list[Body], str | None]:
    """(volumes, mounts, model path inside the container) for the model source."""
    if source.pvc is not None:
        sub = source.pvc.sub_path or ""
        return ([{"name": "model", "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True}}],
                [{"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}],
                f"{MODEL_MOUNT}/{sub}".rstrip("/"))
    if source.host_path is not None:
        return ([{"name": "model", "hostPath": {"path": source.host_path.path, "type": "Directory"}}],
                [{"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}],
                MODEL_MOUNT)
    return [], [], None


def _tolerations(role_spec: RoleSpec) -> list[Body]:
    given = [t.model_dump(mode="json", by_alias=True) for t in role_spec.scheduling.tolerations]
    # Engines ask for GPUs; clusters commonly taint GPU nodes so that nothing else lands there.
    if not any(t.get("key") == GPU_RESOURCE for t in given):
        given.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    return given


def _resources(role_spec: RoleSpec) -> Body:
    requests = dict(role_spec.resources.requests)
    limits = dict(role_spec.resources.limits)
    limits[GPU_RESOURCE] = str(role_spec.gpus_per_node)
    requests[GPU_RESOURCE] = str(role_spec.gpus_per_node)
    return {"requests": requests, "limits": limits}


def pod_flags(ctx: RenderContext, spec: InferencePoolSpec, group: GroupId, node_rank: int) -> tuple[Flag, ...]:
    """The operator-owned SGLang flags of one pod of `group`: what its command line carries, and what the
    serverArgs gate expects its engine to show."""
    _, _, model_path = _model_volume(spec.model.source)
    dist_init_addr = None
    if spec.role(group.role).nodes_per_group > 1:
        leader = group.pod_name(ctx.pool, 0)
        dist_init_addr = f"{leader}.{service_name(ctx.pool, group.role)}.{ctx.namespace}.svc:{DIST_PORT}"
    return engine_args.managed_flags(spec, group.role, node_rank=node_rank, dist_init_addr=dist_init_addr,
                                     model_path=model_path)


# SGLang's sampler takes each rank's own sampled token ids unless this is set (or the batch has a grammar): its
# kernels are deterministic "in most cases", and a token that differs on one rank changes that rank's stop check,
# batch and next collectives (a hang; in PD a prefill rank's first token carries into its decode peer). Set, the
# ranks agree on the MIN of each token with one all-reduce of the batch's token ids per step. Not typed: it is the
# safe setting for every group of more than one rank, and refused in spec.engine.env (api/flags.py REFUSED_ENV).
def token_agreement_env(role_spec: RoleSpec) -> list[Body]:
    return [{"name": flags.TOKEN_AGREEMENT_ENV, "value": "1"}] if role_spec.tp > 1 else []


def engine_pod(ctx: RenderContext, spec: InferencePoolSpec, group: GroupId, node_rank: int, revision: str) -> Body:
    role_spec = spec.role(group.role)
    group_name = group.name(ctx.pool)
    pod_name = group.pod_name(ctx.pool, node_rank)
    volumes, mounts, _ = _model_volume(spec.model.source)
    args = engine_args.command_line(spec, pod_flags(ctx, spec, group, node_rank))
    ports = [{"name": "http", "containerPort": role_spec.port},
             {"name": "agent", "containerPort": AGENT_PORT},
             {"name": "metrics", "containerPort": METRICS_PORT}]
    if isinstance(role_spec, PrefillSpec):
        ports.append({"name": "bootstrap", "containerPort": role_spec.bootstrap_port})
    if role_spec.nodes_per_group > 1:
        ports.append({"name": "dist", "containerPort": DIST_PORT})
    patches = [str(p) for p in spec.engine.patches]
    pod_labels = {**group_labels(ctx, group, revision), labels.RANK: str(node_rank),
                  labels.KV_LAYOUT: layout.kv_layout(spec),
                  **labels.provenance(patches, spec.engine.image),
                  **gang.labels(role_spec.scheduling, group_name, revision)}
    annotations = {labels.PATCHES: ",".join(patches), labels.IMAGE: spec.engine.image,
                   **gang.annotations(role_spec.scheduling, role_spec.nodes_per_group)}
    if isinstance(role_spec, PrefillSpec):
        # sglang-router's Kubernetes service discovery reads a prefill worker's bootstrap port from here.
        annotations["sglang.ai/bootstrap-port"] = str(role_spec.bootstrap_port)
    # RDMA memory registration pins pages: IPC_LOCK, and only then (it takes the pod out of Pod Security's
    # baseline; render/pod_security.py).
    rdma = spec.transfer.backend in (TransferBackend.MOONCAKE, TransferBackend.NIXL) and bool(spec.transfer.ib_device)
    # Only node rank 0 runs SGLang's HTTP server; the other nodes of a multi-node group serve a placeholder with
    # just /ping, /health and /health_generate, all answered without generating. /v1/models on them would never
    # answer, and the group would never be Ready.
    http = {"path": "/v1/models" if node_rank == 0 else "/health", "port": "http"}
    pod_spec: Body = {
        "hostname": pod_name,
        "subdomain": service_name(ctx.pool, group.role),
        "restartPolicy": "Never",  # a group lives and dies as a unit; the operator restarts it whole
        "terminationGracePeriodSeconds": role_spec.drain_seconds + SHUTDOWN_SECONDS,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,  # engines never talk to the Kubernetes API
        "securityContext": pod_security.engine_pod(spec.engine.run_as_user, spec.engine.run_as_group),
        "nodeSelector": dict(role_spec.scheduling.node_selector),
        "tolerations": _tolerations(role_spec),
        "initContainers": [{
            "name": "pdfleet-runtime",
            "image": ctx.runtime_image,
            "command": ["pdfleet-install-runtime", RUNTIME_MOUNT],
            "volumeMounts": [{"name": "pdfleet-runtime", "mountPath": RUNTIME_MOUNT}],
            "securityContext": pod_security.container(read_only_root=True),
        }],
        "containers": [{
            "name": "engine",
            "image": spec.engine.image,
            "imagePullPolicy": str(spec.engine.image_pull_policy),
            "command": ["python3", "-m", "pdfleet.runtime.launcher"],
            "args": [*(f"--patch={p}" for p in patches), f"--agent-port={AGENT_PORT}", f"--metrics-port={METRICS_PORT}",
                     "--", *args],
            "env": [
                {"name": "PYTHONPATH", "value": f"{RUNTIME_MOUNT}/lib"},
                {"name": "PDFLEET_POOL", "value": ctx.pool},
                {"name": "PDFLEET_GROUP", "value": group_name},
                {"name": "PDFLEET_NODE_RANK", "value": str(node_rank)},
                # The agent names its pod in every answer, so the operator never takes another pod's
                # processes at this pod's address for this pod's (see rank_health.own_answers).
                {"name": agent.POD_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                *token_agreement_env(role_spec),
                *(e.to_container() for e in spec.engine.env),
            ],
            "ports": ports,
            "resources": _resources(role_spec),
            "volumeMounts": [
                {"name": "pdfleet-runtime", "mountPath": RUNTIME_MOUNT, "readOnly": True},
                {"name": "dshm", "mountPath": "/dev/shm"},
                *mounts,
            ],
            # Loading weights takes minutes: startup allows an hour before liveness applies. It asks every 2 s
            # (a cheap, non-generating endpoint) so that a loaded engine joins the router seconds, not a period,
            # after it can serve.
            "startupProbe": {"httpGet": http, "periodSeconds": 2, "failureThreshold": 1800},
            "readinessProbe": {"httpGet": http, "periodSeconds": 10, "failureThreshold": 3},
            "livenessProbe": {"httpGet": {"path": "/livez", "port": "agent"}, "periodSeconds": 20,
                              "failureThreshold": 3},
            "lifecycle": {"preStop": {"exec": {"command": _drain_command(role_spec.drain_seconds)}}},
            "securityContext": pod_security.container(add=["IPC_LOCK"] if rdma else []),
        }],
        "volumes": [
            {"name": "pdfleet-runtime", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},  # NCCL and the rank ledger live in /dev/shm
            *volumes,
        ],
    }
    if affinity := placement.affinity(ctx.pool, role_spec.scheduling):
        pod_spec["affinity"] = affinity
    if spread := placement.spread_constraints(ctx.pool, group.role, role_spec.scheduling.spread):
        pod_spec["topologySpreadConstraints"] = spread
    if role_spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = role_spec.scheduling.priority_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": ctx.metadata(pod_name, pod_labels, annotations),
        "spec": pod_spec,
    }


def group_pods(ctx: RenderContext, spec: InferencePoolSpec, group: GroupId, revision: str) -> list[Body]:
    return [engine_pod(ctx, spec, group, rank, revision) for rank in range(spec.role(group.role).nodes_per_group)]


def _drain_command(seconds: int) -> list[str]:
    """The preStop hook: `runtime/drain.py` waits until the engine has nothing in flight, at most `seconds`."""
    command = ["python3", "-m", "pdfleet.runtime.drain"]
    return command if seconds == DEFAULT_DRAIN_SECONDS else [*command, f"--timeout={seconds}"]
