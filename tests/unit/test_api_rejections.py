"""Invalid InferencePool specs, each refused with a message that names the offending field.

The table is shared: these tests check the Python side (pydantic models plus the Python-only checks), and
tests/integration/test_crd.py runs the same table against a real kube-apiserver with the generated CRD. A rule
that one side enforces and the other does not fails one of the two.
"""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from sglang.srt.entrypoints.openai import chat_encoding
from sglang.srt.function_call.function_call_parser import FunctionCallParser

from pdfleet.operator.api import validate
from pdfleet.operator.api.model import BUILT_IN_ENCODING_OF_PARSER

_DELETE = object()


def minimal_spec() -> dict[str, Any]:
    """The smallest valid spec; every case below breaks exactly one thing in it."""
    return {
        "model": {"servedName": "tiny", "source": {"path": "/models/tiny"}},
        "engine": {"image": "lmsysorg/sglang:v0.5.23", "sglangVersion": "0.5.23"},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
    }


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`base` with `patch` merged in: dicts merge, anything else replaces, `_DELETE` removes the key."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is _DELETE:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    patch: dict[str, Any]
    path: str  # the field the refusal must name (the apiserver's message must contain it too)
    says: str  # a fragment of the Python message
    apiserver_says: str | None = None  # where the apiserver words a schema error differently

    @property
    def spec(self) -> dict[str, Any]:
        return merged(minimal_spec(), self.patch)


INVALID_SPECS: tuple[Case, ...] = (
    Case("chat template with the v4 parser",
         {"model": {"toolCallParser": "deepseekv4", "chatTemplate": "/t.jinja"}},
         "spec.model.chatTemplate", "chatTemplate cannot be combined with toolCallParser deepseekv4"),
    Case("chat template with the v4.1 parser",
         {"model": {"toolCallParser": "deepseekv41", "chatTemplate": "/t.jinja"}},
         "spec.model.chatTemplate", "chatTemplate cannot be combined with toolCallParser deepseekv41"),
    Case("chat template with the v3.2 parser",
         {"model": {"toolCallParser": "deepseekv32", "chatTemplate": "chatml"}},
         "spec.model.chatTemplate", "chatTemplate cannot be combined with toolCallParser deepseekv32"),
    Case("chat template with the Kimi-K3 parser",
         {"model": {"toolCallParser": "kimi_k3", "chatTemplate": "/t.jinja"}},
         "spec.model.chatTemplate", "chatTemplate cannot be combined with toolCallParser kimi_k3"),
    Case("the removed chat encoding field",
         {"model": {"encoding": "dsv4", "toolCallParser": "deepseekv4"}},
         "spec.model.encoding", "Extra inputs are not permitted", apiserver_says="unknown field"),
    Case("tp smaller than the GPUs of the group",
         {"prefill": {"tp": 4, "gpusPerNode": 8}},
         "spec.prefill.tp", "tp must equal gpusPerNode * nodesPerGroup"),
    Case("tp larger than the GPUs of a multi-node group",
         {"decode": {"tp": 32, "gpusPerNode": 8, "nodesPerGroup": 2}},
         "spec.decode.tp", "tp must equal gpusPerNode * nodesPerGroup"),
    Case("dp that does not divide tp",
         {"decode": {"tp": 8, "gpusPerNode": 8, "dp": 3}},
         "spec.decode.dp", "dp (DP attention) must divide tp"),
    Case("no decode groups in a running pool",
         {"decode": {"replicas": 0}},
         "spec.decode.replicas", "decode.replicas must be at least 1 unless the pool is paused"),
    Case("no prefill groups in a running pool",
         {"prefill": {"replicas": 0}},
         "spec.prefill.replicas", "prefill.replicas must be at least 1 unless the pool is paused"),
    Case("decode outside the ratio band",
         {"prefill": {"replicas": 4}, "decode": {"replicas": 1},
          "scaling": {"ratio": {"minDecodePerPrefill": "0.5", "maxDecodePerPrefill": "2"}}},
         "spec.decode.replicas", "decode.replicas per prefill.replicas must lie within scaling.ratio"),
    Case("decode a tenth short of the band",
         {"prefill": {"replicas": 10}, "decode": {"replicas": 2},
          "scaling": {"ratio": {"minDecodePerPrefill": "0.21", "maxDecodePerPrefill": "2"}}},
         "spec.decode.replicas", "decode.replicas per prefill.replicas must lie within scaling.ratio"),
    Case("a ratio band upside down",
         {"scaling": {"ratio": {"minDecodePerPrefill": "3", "maxDecodePerPrefill": "2"}}},
         "spec.scaling.ratio.maxDecodePerPrefill", "minDecodePerPrefill must not exceed maxDecodePerPrefill"),
    Case("a ratio band from zero",
         {"scaling": {"ratio": {"minDecodePerPrefill": "0", "maxDecodePerPrefill": "2"}}},
         "spec.scaling.ratio.minDecodePerPrefill", "minDecodePerPrefill must be above 0"),
    Case("a ratio as a fraction",
         {"scaling": {"ratio": {"minDecodePerPrefill": "1/2", "maxDecodePerPrefill": "2"}}},
         "spec.scaling.ratio.minDecodePerPrefill", "should match"),
    Case("bootstrap port above 65535",
         {"prefill": {"bootstrapPort": 70000}},
         "spec.prefill.bootstrapPort", "less than or equal to 65535"),
    Case("engine port 0",
         {"decode": {"port": 0}},
         "spec.decode.port", "greater than or equal to 1"),
    Case("different engine ports behind one router",
         {"decode": {"port": 31000}},
         "spec.decode.port", "prefill.port and decode.port must be equal while the pool has a router"),
    Case("the tool-call canary without a tool-call parser",
         {"rollout": {"verification": {"toolCallCanary": True}}},
         "spec.rollout.verification.toolCallCanary",
         "rollout.verification.toolCallCanary needs model.toolCallParser"),
    Case("bootstrap port equal to the HTTP port",
         {"prefill": {"port": 9000, "bootstrapPort": 9000}},
         "spec.prefill.bootstrapPort", "bootstrapPort must differ from port"),
    Case("a duration in words",
         {"health": {"heartbeatPeriod": "5 seconds"}},
         "spec.health.heartbeatPeriod", "should match"),
    Case("a duration in days",
         {"health": {"hangAfter": "1d"}},
         "spec.health.hangAfter", "should match"),
    Case("a zero duration",
         {"health": {"restartBudget": {"window": "0s"}}},
         "spec.health.restartBudget.window", "must be a positive duration"),
    Case("desync detected faster than the heartbeat",
         {"health": {"heartbeatPeriod": "10s", "desyncAfter": "5s"}},
         "spec.health.desyncAfter", "desyncAfter must be longer than heartbeatPeriod"),
    Case("backoff that shrinks",
         {"health": {"backoff": {"initial": "10m", "max": "1m"}}},
         "spec.health.backoff.max", "backoff.max must be at least backoff.initial"),
    Case("extra arg setting the TP size",
         {"engine": {"extraArgs": ["--mem-fraction-static", "0.8", "--tp-size", "8"]}},
         "spec.engine.extraArgs[2]", "extraArgs may not set"),
    Case("extra arg setting the disaggregation mode with =",
         {"engine": {"extraArgs": ["--disaggregation-mode=decode"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set"),
    Case("extra arg abbreviating a managed flag",
         {"engine": {"extraArgs": ["--disable-overlap"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set"),
    Case("extra arg using the --tp alias",
         {"engine": {"extraArgs": ["--tp", "8"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set"),
    Case("extra arg setting the host",
         {"engine": {"extraArgs": ["--host", "127.0.0.1"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set"),
    Case("extra arg enabling the PD role switch (decided per TP rank, no agreement)",
         {"engine": {"extraArgs": ["--mem-fraction-static", "0.8", "--enable-pd-role-switch"]}},
         "spec.engine.extraArgs[2]", "extraArgs may not set --enable-pd-role-switch"),
    Case("extra arg abbreviating the PD role switch",
         {"engine": {"extraArgs": ["--enable-pd-role"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set --enable-pd-role-switch",
         apiserver_says="extraArgs may not set --enable-pd-role"),
    Case("extra arg enabling LoRA (adapters loaded and admitted per TP rank, no agreement)",
         {"engine": {"extraArgs": ["--enable-lora", "--max-lora-rank", "8"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set --enable-lora"),
    Case("extra arg loading LoRA adapters at start (turns LoRA on)",
         {"engine": {"extraArgs": ["--mem-fraction-static", "0.8", "--lora-paths", "a=/models/a"]}},
         "spec.engine.extraArgs[2]", "extraArgs may not set --lora-paths"),
    Case("extra arg abbreviating --lora-paths",
         {"engine": {"extraArgs": ["--lora-p=/models/a"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set --lora-paths",
         apiserver_says="extraArgs may not set --lora-p"),
    Case("extra arg enabling the FlexKV cache (TP ranks synced by sends received in call order)",
         {"engine": {"extraArgs": ["--enable-flexkv"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set --enable-flexkv"),
    Case("extra arg abbreviating --enable-flexkv",
         {"engine": {"extraArgs": ["--page-size", "16", "--enable-flex"]}},
         "spec.engine.extraArgs[2]", "extraArgs may not set --enable-flexkv",
         apiserver_says="extraArgs may not set --enable-flex"),
    Case("extra arg picking a registered radix-cache back-end (FlexKV is the only one)",
         {"engine": {"extraArgs": ["--radix-cache-backend=flexkv"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set --radix-cache-backend"),
    Case("extra arg setting a client key on the engines (the router and the operator would be refused)",
         {"engine": {"extraArgs": ["--api-key", "k"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set --api-key"),
    Case("env with both a literal value and a Secret's key",
         {"engine": {"env": [{"name": "HF_TOKEN", "value": "hf_x",
                              "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]}},
         "spec.engine.env[0].valueFrom", "env: set value or valueFrom, not both"),
    Case("env taking its value from a Secret's key and a ConfigMap's at once",
         {"engine": {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"},
                                                         "configMapKeyRef": {"name": "c", "key": "k"}}}]}},
         "spec.engine.env[0].valueFrom", "set exactly one of secretKeyRef and configMapKeyRef"),
    Case("env valueFrom naming no source",
         {"router": {"env": [{"name": "X", "valueFrom": {}}]}},
         "spec.router.env[0].valueFrom", "set exactly one of secretKeyRef and configMapKeyRef"),
    Case("router env setting the router's control-plane key",
         {"router": {"env": [{"name": "PDFLEET_ROUTER_ADMIN_KEY", "value": "k"}]}},
         "spec.router.env[0].name", "router env may not set PDFLEET_ROUTER_ADMIN_KEY"),
    Case("extra arg letting clients send code the engines run (custom logit processors)",
         {"engine": {"extraArgs": ["--enable-custom-logit-processor"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set --enable-custom-logit-processor"),
    Case("extra arg starting SGLang's gRPC server (it serves the weight updates refused over HTTP)",
         {"engine": {"extraArgs": ["--grpc-port", "50051"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set --grpc-port"),
    Case("extra arg serving the engine over gRPC",
         {"engine": {"extraArgs": ["--smg-grpc-mode"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set --smg-grpc-mode"),
    Case("extra arg serving the engine over gRPC (SGLang's own mode)",
         {"engine": {"extraArgs": ["--grpc-mode"]}},
         "spec.engine.extraArgs[0]", "extraArgs may not set --grpc-mode"),
    Case("env starting SGLang's gRPC server",
         {"engine": {"env": [{"name": "SGLANG_GRPC_PORT", "value": "50051"}]}},
         "spec.engine.env[0].name", "env may not set SGLANG_GRPC_PORT"),
    Case("env making each DP-attention rank use its own token counts",
         {"engine": {"env": [{"name": "SGLANG_SCHEDULER_SKIP_ALL_GATHER", "value": "1"}]}},
         "spec.engine.env[0].name", "env may not set SGLANG_SCHEDULER_SKIP_ALL_GATHER"),
    Case("env dropping speculative decoding's rank-0 broadcasts",
         {"engine": {"env": [{"name": "PDFLEET_X", "value": "1"}, {"name": "SGLANG_SPEC_TP_SYNC", "value": "off"}]}},
         "spec.engine.env[1].name", "env may not set SGLANG_SPEC_TP_SYNC"),
    Case("unknown patch id",
         {"engine": {"patches": ["make-it-fast"]}},
         "spec.engine.patches[0]", "unknown patch make-it-fast", apiserver_says="Unsupported value"),
    Case("repeated patch id",
         {"engine": {"patches": ["abort-consensus", "abort-consensus"]}},
         "spec.engine.patches", "patches must not repeat an id", apiserver_says="Duplicate value"),
    Case("repeated env name",
         {"engine": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}},
         "spec.engine.env", "env names must be unique", apiserver_says="Duplicate value"),
    Case("repeated router env name",
         {"router": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}},
         "spec.router.env", "env names must be unique", apiserver_says="Duplicate value"),
    Case("unknown overlap switch",
         {"engine": {"overlapSchedule": "Off"}},
         "spec.engine.overlapSchedule", "Input should be", apiserver_says="Unsupported value"),
    Case("SGLang version that is not a version",
         {"engine": {"sglangVersion": "latest"}},
         "spec.engine.sglangVersion", "should match"),
    Case("GPUs in resources instead of gpusPerNode",
         {"prefill": {"resources": {"limits": {"nvidia.com/gpu": 8}}}},
         "spec.prefill.resources.limits", "may not set nvidia.com/gpu"),
    Case("IB device with the fake transfer",
         {"transfer": {"backend": "fake", "ibDevice": "mlx5_0"}},
         "spec.transfer.ibDevice", "ibDevice has no meaning with backend fake"),
    Case("toleration Exists with a value",
         {"decode": {"scheduling": {"tolerations": [{"key": "gpu", "operator": "Exists", "value": "yes"}]}}},
         "spec.decode.scheduling.tolerations[0].value", "a toleration with operator Exists may not set value"),
    Case("gang queue name that is not a DNS label",
         {"decode": {"scheduling": {"gang": {"queueName": "GPU_queue"}}}},
         "spec.decode.scheduling.gang.queueName", "should match"),
    Case("gang through a scheduler other than Kueue",
         {"prefill": {"scheduling": {"gang": {"scheduler": "Volcano", "queueName": "gpus"}}}},
         "spec.prefill.scheduling.gang.scheduler", "Input should be", apiserver_says="Unsupported value"),
    Case("gang without a queue",
         {"decode": {"scheduling": {"gang": {"scheduler": "Kueue"}}}},
         "spec.decode.scheduling.gang.queueName", "Field required", apiserver_says="Required value"),
    Case("gang on the router, which is no group",
         {"router": {"scheduling": {"gang": {"queueName": "gpus"}}}},
         "spec.router.scheduling.gang", "Extra inputs are not permitted", apiserver_says="unknown field"),
    Case("topology without gang",
         {"decode": {"scheduling": {"topology": {"nodeLabel": "nvidia.com/gpu.clique"}}}},
         "spec.decode.scheduling.topology", "scheduling.topology needs scheduling.gang"),
    Case("topology on a node label that is not a label key",
         {"decode": {"scheduling": {"gang": {"queueName": "gpus"}, "topology": {"nodeLabel": "rack name"}}}},
         "spec.decode.scheduling.topology.nodeLabel", "should match"),
    Case("a required spread with a Kueue topology",
         {"decode": {"scheduling": {"gang": {"queueName": "gpus"}, "topology": {"nodeLabel": "nvidia.com/gpu.clique"},
                                    "spread": {"nodeLabel": "topology.kubernetes.io/zone", "mode": "Required"}}}},
         "spec.decode.scheduling.spread.mode",
         "scheduling.spread.mode Required cannot be combined with scheduling.topology"),
    Case("spread on a node label that is not a label key",
         {"prefill": {"scheduling": {"spread": {"nodeLabel": "zone/"}}}},
         "spec.prefill.scheduling.spread.nodeLabel", "should match"),
    Case("spread on the router, which has no groups",
         {"router": {"scheduling": {"spread": {"nodeLabel": "topology.kubernetes.io/zone"}}}},
         "spec.router.scheduling.spread", "Extra inputs are not permitted", apiserver_says="unknown field"),
    Case("prefill near prefill",
         {"prefill": {"scheduling": {"near": {"role": "prefill", "nodeLabel": "example.com/rack"}}}},
         "spec.prefill.scheduling.near.role", "scheduling.near.role must name the other role"),
    Case("decode near decode",
         {"decode": {"scheduling": {"near": {"role": "decode", "nodeLabel": "example.com/rack"}}}},
         "spec.decode.scheduling.near.role", "scheduling.near.role must name the other role"),
    Case("near with no weight",
         {"decode": {"scheduling": {"near": {"role": "prefill", "nodeLabel": "example.com/rack", "weight": 0}}}},
         "spec.decode.scheduling.near.weight", "greater than or equal to 1"),
    Case("near the router",
         {"prefill": {"scheduling": {"near": {"role": "router", "nodeLabel": "example.com/rack"}}}},
         "spec.prefill.scheduling.near.role", "Input should be", apiserver_says="Unsupported value"),
    Case("rollout that may take no group down",
         {"rollout": {"maxUnavailable": {"decode": 0}}},
         "spec.rollout.maxUnavailable.decode", "greater than or equal to 1"),
    Case("unknown router policy",
         {"router": {"prefillPolicy": "least_loaded"}},
         "spec.router.prefillPolicy", "Input should be", apiserver_says="Unsupported value"),
    Case("autoscaling bounds upside down",
         {"autoscaling": {"decode": {"minReplicas": 3, "maxReplicas": 2, "targets": {"kvCacheUsage": "0.8"}}}},
         "spec.autoscaling.decode.maxReplicas", "minReplicas must not exceed maxReplicas"),
    Case("autoscaling to no groups",
         {"autoscaling": {"prefill": {"maxReplicas": 0, "targets": {"queuePerEngine": 4}}}},
         "spec.autoscaling.prefill.maxReplicas", "greater than or equal to 1"),
    Case("an autoscaled role without a target",
         {"autoscaling": {"decode": {"maxReplicas": 4, "targets": {}}}},
         "spec.autoscaling.decode.targets", "at least one target is needed"),
    Case("a KV cache usage target above 1",
         {"autoscaling": {"decode": {"maxReplicas": 4, "targets": {"kvCacheUsage": "1.5"}}}},
         "spec.autoscaling.decode.targets.kvCacheUsage", "kvCacheUsage must be above 0 and at most 1"),
    Case("a KV cache usage target of 0",
         {"autoscaling": {"prefill": {"maxReplicas": 4, "targets": {"kvCacheUsage": "0"}}}},
         "spec.autoscaling.prefill.targets.kvCacheUsage", "kvCacheUsage must be above 0 and at most 1"),
    Case("an inter-token latency target on prefill",
         {"autoscaling": {"prefill": {"maxReplicas": 4, "targets": {"interTokenLatencyMilliseconds": 50}}}},
         "spec.autoscaling.prefill.targets.interTokenLatencyMilliseconds", "Extra inputs are not permitted",
         apiserver_says="unknown field"),
    Case("a negative stabilisation window",
         {"autoscaling": {"decode": {"maxReplicas": 4, "targets": {"kvCacheUsage": "0.8"},
                                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": -1}}}}},
         "spec.autoscaling.decode.behavior.scaleDown.stabilizationWindowSeconds", "greater than or equal to 0"),
    Case("a role both autoscaled and a scale target",
         {"decode": {"scaleTarget": True},
          "autoscaling": {"decode": {"maxReplicas": 4, "targets": {"kvCacheUsage": "0.8"}}}},
         "spec.autoscaling.decode", "autoscaling.decode and decode.scaleTarget may not both be set"),
    Case("autoscaled roles whose highest sizes leave the ratio band",
         {"scaling": {"ratio": {"minDecodePerPrefill": "1", "maxDecodePerPrefill": "2"}},
          "autoscaling": {"prefill": {"maxReplicas": 2, "targets": {"queuePerEngine": 4}},
                          "decode": {"maxReplicas": 6, "targets": {"kvCacheUsage": "0.8"}}}},
         "spec.autoscaling.prefill", "autoscaling.prefill.minReplicas and maxReplicas must lie within "
                                     "scaling.ratio"),
    Case("an autoscaled role a Clamp band could never let reach its maximum",
         {"scaling": {"ratio": {"minDecodePerPrefill": "1", "maxDecodePerPrefill": "2", "onScale": "Clamp"}},
          "autoscaling": {"decode": {"maxReplicas": 4, "targets": {"kvCacheUsage": "0.8"}}}},
         "spec.autoscaling.decode", "autoscaling.decode.minReplicas and maxReplicas must lie within scaling.ratio"),
    Case("a host folder reached through '..'",
         {"model": {"source": {"path": _DELETE, "hostPath": {"path": "/mnt/models/../../run/containerd"}}}},
         "spec.model.source.hostPath.path", "hostPath.path may not contain '..'"),
    Case("engines as root by number",
         {"engine": {"runAsUser": 0}},
         "spec.engine.runAsUser", "greater than or equal to 1"),
    Case("a group without a user",
         {"engine": {"runAsGroup": 1000}},
         "spec.engine.runAsGroup", "runAsGroup needs runAsUser"),
    Case("unknown field",
         {"engine": {"overlap": "Disabled"}},
         "spec.engine.overlap", "Extra inputs are not permitted", apiserver_says="unknown field"),
)


def test_the_minimal_spec_is_valid() -> None:
    assert validate({"spec": minimal_spec()}) == []


def test_a_paused_pool_may_have_no_groups() -> None:
    spec = merged(minimal_spec(), {"paused": True, "prefill": {"replicas": 0}, "decode": {"replicas": 0}})
    assert validate({"spec": spec}) == []


@pytest.mark.parametrize("model", [
    pytest.param({"toolCallParser": "qwen25", "chatTemplate": "/t.jinja"}, id="template with a plain parser"),
    pytest.param({"toolCallParser": "deepseekv4", "reasoningParser": "deepseek-v3"}, id="v4 parser alone"),
    pytest.param({"chatTemplate": "chatml"}, id="template without a parser"),
])
def test_a_chat_template_is_accepted_where_sglang_applies_it(model: dict[str, Any]) -> None:
    assert validate({"spec": merged(minimal_spec(), {"model": model})}) == []


@pytest.mark.parametrize(("parser", "encoding"), sorted(BUILT_IN_ENCODING_OF_PARSER.items()))
def test_sglang_picks_its_built_in_encoding_from_the_parser_even_with_a_chat_template(
        parser: str, encoding: str) -> None:
    """The premise of the chatTemplate refusals, checked against the installed SGLang: the parser alone chooses
    the encoding, whatever the model and its template."""
    llama = SimpleNamespace(architectures=["LlamaForCausalLM"], model_type="llama")
    templated = SimpleNamespace(chat_template="{{ messages }}")
    assert chat_encoding.resolve_chat_encoding_spec(
        hf_config=llama, tokenizer=templated, tool_call_parser=parser) == encoding
    assert parser in FunctionCallParser.ToolCallParserEnum


def test_every_other_sglang_parser_leaves_the_chat_template_in_charge() -> None:
    """A parser SGLang adds with a built-in encoding fails here until the refusals know about it."""
    llama = SimpleNamespace(architectures=["LlamaForCausalLM"], model_type="llama")
    templated = SimpleNamespace(chat_template="{{ messages }}")
    with_encoding = {parser for parser in FunctionCallParser.ToolCallParserEnum
                     if chat_encoding.resolve_chat_encoding_spec(
                         hf_config=llama, tokenizer=templated, tool_call_parser=parser) is not None}
    assert with_encoding == set(BUILT_IN_ENCODING_OF_PARSER)


# Specs at the edge of a rule that a careless check would refuse: every one must be accepted by both sides.
EDGE_SPECS: tuple[tuple[str, dict[str, Any]], ...] = (
    # 0.3 * 10 is 3.0000000000000004 in floating point: the band's CEL compares whole hundredths.
    ("decode exactly at a band of 0.3 per prefill", {"prefill": {"replicas": 10}, "decode": {"replicas": 3},
                                                      "scaling": {"ratio": {"minDecodePerPrefill": "0.3",
                                                                            "maxDecodePerPrefill": "0.3"}}}),
    ("outside the band while paused", {"paused": True, "prefill": {"replicas": 4}, "decode": {"replicas": 0},
                                       "scaling": {"ratio": {"minDecodePerPrefill": "1",
                                                             "maxDecodePerPrefill": "2"}}}),
    # A Follow band moves a role that is not autoscaled wherever the autoscaled one goes: no bound to fit.
    ("decode autoscaled past a fixed prefill's band with Follow",
     {"scaling": {"ratio": {"minDecodePerPrefill": "1", "maxDecodePerPrefill": "2"}},
      "autoscaling": {"decode": {"maxReplicas": 8, "targets": {"kvCacheUsage": "0.8"}}}}),
    ("both roles autoscaled with their lowest and highest sizes in the band",
     {"scaling": {"ratio": {"minDecodePerPrefill": "1", "maxDecodePerPrefill": "2"}},
      "autoscaling": {"prefill": {"maxReplicas": 3, "targets": {"timeToFirstTokenMilliseconds": 800}},
                      "decode": {"minReplicas": 1, "maxReplicas": 6,
                                 "targets": {"interTokenLatencyMilliseconds": 40, "runningPerEngine": 64}}}}),
    # Kueue's topology choice wins over a preference: only a required spread could strand an admitted group.
    ("a preferred spread with a Kueue topology",
     {"decode": {"scheduling": {"gang": {"queueName": "gpus"}, "topology": {"nodeLabel": "nvidia.com/gpu.clique"},
                                "spread": {"nodeLabel": "topology.kubernetes.io/zone"}}}}),
    ("each role near the other, with a required spread",
     {"prefill": {"scheduling": {"near": {"role": "decode", "nodeLabel": "example.com/rack"}}},
      "decode": {"scheduling": {"near": {"role": "prefill", "nodeLabel": "example.com/rack", "weight": 1},
                                "spread": {"nodeLabel": "topology.kubernetes.io/zone", "mode": "Required"}}}}),
)


@pytest.mark.parametrize(("what", "patch"), EDGE_SPECS, ids=[what for what, _ in EDGE_SPECS])
def test_an_edge_spec_is_accepted(what: str, patch: dict[str, Any]) -> None:
    assert validate({"apiVersion": "pdfleet.dev/v1alpha1", "kind": "InferencePool", "metadata": {"name": "p"},
                     "spec": merged(minimal_spec(), patch)}) == []


def test_the_table_has_at_least_twenty_distinct_cases() -> None:
    assert len(INVALID_SPECS) >= 20
    assert len({case.id for case in INVALID_SPECS}) == len(INVALID_SPECS)


@pytest.mark.parametrize("case", INVALID_SPECS, ids=lambda case: case.id)
def test_python_refuses_the_spec_naming_the_field(case: Case) -> None:
    problems = validate({"spec": case.spec})
    assert any(p.path == case.path and case.says in p.message for p in problems), (
        f"expected a problem at {case.path} saying {case.says!r}, got: {[str(p) for p in problems]}"
    )
