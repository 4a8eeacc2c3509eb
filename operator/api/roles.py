"""`spec.prefill` and `spec.decode`: how many engine groups each role runs and how each group is shaped.

An engine group is one SGLang engine: one pod for single-node TP, `nodesPerGroup` pods for multi-node TP.

The parallelism rule, decided here and enforced at admission:
    tp == gpusPerNode * nodesPerGroup, and dp divides tp.
One TP rank per GPU, every GPU of the group used: SGLang places tp_size / nnodes ranks on each node
(`tp_size_per_node`), so tp must be a multiple of the node count, and pdfleet requests exactly `gpusPerNode`
GPUs per pod, so anything but equality either leaves GPUs idle or asks for ranks without GPUs. `dp` is SGLang's
DP attention inside one engine (`--dp-size` with `--enable-dp-attention`), which splits the TP ranks into
attention groups and so must divide tp; it adds no GPUs. Plain data parallelism is `replicas`: more groups
behind the router. Pipeline parallelism is not supported (it selects a different scheduler loop).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule
from pdfleet.operator.api.resources import Resources
from pdfleet.operator.api.role_name import Role as Role  # re-exported: the rest of the operator names it from here
from pdfleet.operator.api.scalars import Port
from pdfleet.operator.api.scheduling import EngineScheduling, near_names_the_other_role

DEFAULT_ENGINE_PORT = 30000
DEFAULT_DRAIN_SECONDS = 150  # with 30 s of shutdown, the 180 s grace period engine pods always had
DEFAULT_BOOTSTRAP_PORT = 8998


_TP_FILLS_THE_GROUP = Rule(
    cel="self.tp == self.gpusPerNode * self.nodesPerGroup",
    holds=lambda r: r.tp == r.gpus_per_node * r.nodes_per_group,
    message="tp must equal gpusPerNode * nodesPerGroup: one TP rank per GPU of the engine group",
    field=".tp",
)
_DP_DIVIDES_TP = Rule(
    cel="self.tp % self.dp == 0",
    holds=lambda r: r.tp % r.dp == 0,
    message="dp (DP attention) must divide tp",
    field=".dp",
)


class RoleSpec(ApiModel):
    """What prefill and decode have in common."""

    RULES = (_TP_FILLS_THE_GROUP, _DP_DIVIDES_TP)

    replicas: Annotated[int, Field(ge=0, le=1024)] = Field(
        default=1, description="Number of engine groups of this role. At least 1 unless the pool is paused."
    )
    tp: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=1, description="Tensor-parallel size of one engine group; must equal gpusPerNode * nodesPerGroup."
    )
    dp: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=1, description="DP-attention size inside one engine group (--dp-size --enable-dp-attention); "
                               "must divide tp. 1 turns DP attention off.",
    )
    nodes_per_group: Annotated[int, Field(ge=1, le=64)] = Field(
        default=1, description="Pods (nodes) per engine group; more than 1 is multi-node TP."
    )
    gpus_per_node: Annotated[int, Field(ge=1, le=16)] = Field(
        default=1, description="GPUs each pod of a group requests (nvidia.com/gpu)."
    )
    port: Port = Field(default=DEFAULT_ENGINE_PORT, description="HTTP port of the engine (--port).")
    drain_seconds: Annotated[int, Field(ge=0, le=3600)] = Field(
        default=DEFAULT_DRAIN_SECONDS,
        description="How long an engine being removed (a scale-down, a rollout, a person's delete) waits for its "
                    "requests and KV transfers in flight before it is stopped: its pods' preStop drain. The pods' "
                    "grace period is this plus 30 s for SGLang's own shutdown. A change replaces the role's groups "
                    "(a pod's grace period cannot change). Sick groups are stopped at once, whatever this says.",
    )
    resources: Resources = Field(default_factory=Resources, description="CPU and memory per pod.")
    scheduling: EngineScheduling = Field(
        default_factory=EngineScheduling, description="Where the pods may run, and how a group is placed as one."
    )
    scale_target: bool = Field(
        default=False,
        description="Give this role a scale subresource: the operator keeps an InferencePoolRole named "
                    "<pool>-<role>, and what scales it (kubectl scale, a HorizontalPodAutoscaler, KEDA) sets "
                    "replicas here; a change to replicas here is written back to it.",
    )

    @property
    def gpus_per_group(self) -> int:
        return self.gpus_per_node * self.nodes_per_group


_BOOTSTRAP_PORT_IS_NOT_THE_HTTP_PORT = Rule(
    cel="self.bootstrapPort != self.port",
    holds=lambda r: r.bootstrap_port != r.port,
    message="bootstrapPort must differ from port",
    field=".bootstrapPort",
)


class PrefillSpec(RoleSpec):
    """Prefill engines: compute the prompt's KV cache and hand it to a decode engine."""

    RULES = (*RoleSpec.RULES, _BOOTSTRAP_PORT_IS_NOT_THE_HTTP_PORT, near_names_the_other_role(Role.PREFILL))

    bootstrap_port: Port = Field(
        default=DEFAULT_BOOTSTRAP_PORT,
        description="Port where decode engines fetch KV-transfer metadata (--disaggregation-bootstrap-port).",
    )


class DecodeSpec(RoleSpec):
    """Decode engines: receive the KV cache and generate tokens."""

    RULES = (*RoleSpec.RULES, near_names_the_other_role(Role.DECODE))
