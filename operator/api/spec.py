"""`spec`: the whole InferencePool spec, and the rules that relate its sections."""

from __future__ import annotations

from pydantic import Field

from pdfleet.operator.api.autoscaling import SPEC_RULES as AUTOSCALING_RULES
from pdfleet.operator.api.autoscaling import AutoscalingSpec
from pdfleet.operator.api.base import ApiModel, Rule
from pdfleet.operator.api.engine import EngineSpec
from pdfleet.operator.api.health import HealthSpec
from pdfleet.operator.api.model import ModelSpec
from pdfleet.operator.api.network import NetworkPolicySpec
from pdfleet.operator.api.roles import DEFAULT_ENGINE_PORT, DecodeSpec, PrefillSpec, Role, RoleSpec
from pdfleet.operator.api.rollout import RolloutSpec
from pdfleet.operator.api.router import RouterSpec
from pdfleet.operator.api.scaling import ScalingSpec, hundredths_cel, in_band
from pdfleet.operator.api.transfer import TransferSpec


def _replicas_rule(role: Role) -> Rule:
    return Rule(
        cel=f"self.paused || self.{role}.replicas >= 1",
        holds=lambda s: s.paused or s.role(role).replicas >= 1,
        message=f"{role}.replicas must be at least 1 unless the pool is paused: a PD pool needs both roles",
        field=f".{role}.replicas",
    )


def _port_of(role: Role) -> str:
    # CEL sees the object before nested defaults are filled in, so an absent port is the default one.
    return f"(has(self.{role}.port) ? self.{role}.port : {DEFAULT_ENGINE_PORT})"


_ONE_PORT_FOR_THE_ROUTER = Rule(
    cel=f"(has(self.router) && has(self.router.replicas) && self.router.replicas == 0) || "
        f"{_port_of(Role.PREFILL)} == {_port_of(Role.DECODE)}",
    holds=lambda s: s.router.replicas == 0 or s.prefill.port == s.decode.port,
    message="prefill.port and decode.port must be equal while the pool has a router: sglang-router discovers "
            "engines by label and reaches every one on the same port (--service-discovery-port)",
    field=".decode.port",
)


_CANARY_NEEDS_A_PARSER = Rule(
    cel="!has(self.rollout) || !has(self.rollout.verification) || "
        "!has(self.rollout.verification.toolCallCanary) || !self.rollout.verification.toolCallCanary || "
        "has(self.model.toolCallParser)",
    holds=lambda s: not s.rollout.verification.tool_call_canary or s.model.tool_call_parser is not None,
    message="rollout.verification.toolCallCanary needs model.toolCallParser: without a tool-call parser the "
            "engines answer tool calls as text, and the canary would fail every group",
    field=".rollout.verification.toolCallCanary",
)


def _replicas_cel(role: Role) -> str:
    return f"(has(self.{role}.replicas) ? self.{role}.replicas : 1)"


_BAND = "self.scaling.ratio"
_IN_THE_RATIO_BAND = Rule(
    cel=f"self.paused || !has(self.scaling) || !has({_BAND}) || "
        f"({_replicas_cel(Role.DECODE)} * 100 >= {hundredths_cel(_BAND + '.minDecodePerPrefill')} * "
        f"{_replicas_cel(Role.PREFILL)} && {_replicas_cel(Role.DECODE)} * 100 <= "
        f"{hundredths_cel(_BAND + '.maxDecodePerPrefill')} * {_replicas_cel(Role.PREFILL)})",
    holds=lambda s: s.paused or s.scaling.ratio is None or in_band(s.scaling.ratio, prefill=s.prefill.replicas,
                                                                     decode=s.decode.replicas),
    message="decode.replicas per prefill.replicas must lie within scaling.ratio (minDecodePerPrefill to "
            "maxDecodePerPrefill) unless the pool is paused: change both roles together, or the band",
    field=".decode.replicas",
)


class InferencePoolSpec(ApiModel):
    """The desired state of a prefill/decode disaggregated SGLang pool."""

    RULES = (_replicas_rule(Role.PREFILL), _replicas_rule(Role.DECODE), _ONE_PORT_FOR_THE_ROUTER,
             _CANARY_NEEDS_A_PARSER, _IN_THE_RATIO_BAND, *AUTOSCALING_RULES)

    model: ModelSpec = Field(description="The served model and its chat format.")
    engine: EngineSpec = Field(description="The SGLang engine every group runs: image, version, patches, args.")
    prefill: PrefillSpec = Field(description="Prefill engine groups.")
    decode: DecodeSpec = Field(description="Decode engine groups.")
    router: RouterSpec = Field(default_factory=RouterSpec, description="The PD router.")
    transfer: TransferSpec = Field(default_factory=TransferSpec, description="KV-cache transfer backend.")
    health: HealthSpec = Field(default_factory=HealthSpec, description="Rank-health detection and restarts.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="How new revisions roll out.")
    scaling: ScalingSpec = Field(default_factory=ScalingSpec,
                                 description="How the roles' sizes are held together when one is scaled.")
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec,
        description="pdfleet's own autoscaler per role, on the load SGLang publishes; off for a role left out.")
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec,
                                              description="Who may reach the pool's pods (NetworkPolicies).")
    paused: bool = Field(
        default=False,
        description="Stop reconciling engines: nothing is created, replaced or restarted. Replicas may be 0.",
    )

    def role(self, role: Role) -> RoleSpec:
        return self.prefill if role is Role.PREFILL else self.decode
