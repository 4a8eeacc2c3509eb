"""engine_args: the SGLang command line of one engine pod, derived from the spec.

Table tests pin the exact command line for typical pools; property tests check, for any valid spec, that each
managed flag appears once and the user's extra args follow unchanged and in order.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdfleet.operator.api import InferencePoolSpec, Role
from pdfleet.operator.api.flags import MANAGED_FLAGS
from pdfleet.operator.api.model import BUILT_IN_ENCODING_OF_PARSER
from pdfleet.operator.render.engine_args import engine_args
from tests.unit.test_api_rejections import merged, minimal_spec

# Flags written for every engine, whatever the spec says.
ALWAYS = ("--model-path", "--served-model-name", "--host", "--port", "--disaggregation-mode",
          "--disaggregation-transfer-backend", "--tp-size", "--enable-metrics")
# Free SGLang flags that a user may pass; none is managed or a prefix of a managed flag.
FREE_FLAGS = ("--mem-fraction-static", "--context-length", "--chunked-prefill-size", "--max-running-requests",
              "--attention-backend", "--page-size", "--enable-metrics-for-all-schedulers", "--log-level",
              "--kv-cache-dtype", "--watchdog-timeout", "--cuda-graph-max-bs")


def spec_of(patch: dict[str, Any]) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate(merged(minimal_spec(), patch))


def flags(argv: list[str]) -> list[str]:
    return [arg for arg in argv if arg.startswith("--")]


@pytest.mark.effect("spec.model.servedName", "spec.model.source.path")
def test_a_minimal_prefill_engine_gets_exactly_the_managed_flags() -> None:
    assert engine_args(spec_of({}), Role.PREFILL) == [
        "--model-path", "/models/tiny",
        "--served-model-name", "tiny",
        "--host", "0.0.0.0",
        "--port", "30000",
        "--disaggregation-mode", "prefill",
        "--disaggregation-transfer-backend", "mooncake",
        "--tp-size", "1",
        "--enable-metrics",
        "--disaggregation-bootstrap-port", "8998",
    ]


def test_a_decode_engine_has_no_bootstrap_port() -> None:
    argv = engine_args(spec_of({}), Role.DECODE)
    assert argv[argv.index("--disaggregation-mode") + 1] == "decode"
    assert "--disaggregation-bootstrap-port" not in argv


@pytest.mark.parametrize(("patch", "role", "kwargs", "expected_tail"), [
    pytest.param({"engine": {"overlapSchedule": "Disabled"}}, Role.DECODE, {},
                 ["--disable-overlap-schedule"], id="overlap schedule disabled"),
    pytest.param({"engine": {"tokenizerBatchDecode": "Disabled"}}, Role.DECODE, {},
                 ["--disable-tokenizer-batch-decode"], id="tokenizer batch decode disabled"),
    pytest.param({"model": {"toolCallParser": "deepseekv4", "reasoningParser": "deepseek-v3"}},
                 Role.DECODE, {}, ["--tool-call-parser", "deepseekv4", "--reasoning-parser", "deepseek-v3"],
                 id="parsers"),
    pytest.param({"model": {"chatTemplate": "/templates/chat.jinja", "trustRemoteCode": True}}, Role.DECODE, {},
                 ["--chat-template", "/templates/chat.jinja", "--trust-remote-code"], id="template and remote code"),
    pytest.param({"decode": {"tp": 8, "gpusPerNode": 8, "dp": 8}}, Role.DECODE, {},
                 ["--dp-size", "8", "--enable-dp-attention"], id="dp attention"),
    pytest.param({"decode": {"tp": 16, "gpusPerNode": 8, "nodesPerGroup": 2}}, Role.DECODE,
                 {"node_rank": 1, "dist_init_addr": "pool-decode-0-0.pool-decode-0.ns.svc:5000"},
                 ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "pool-decode-0-0.pool-decode-0.ns.svc:5000"],
                 id="multi-node group"),
    pytest.param({"transfer": {"ibDevice": "mlx5_0,mlx5_1"}}, Role.DECODE, {},
                 ["--disaggregation-ib-device", "mlx5_0,mlx5_1"], id="ib device"),
    pytest.param({"engine": {"extraArgs": ["--mem-fraction-static", "0.8"]}}, Role.PREFILL, {},
                 ["--disaggregation-bootstrap-port", "8998", "--mem-fraction-static", "0.8"], id="extra args last"),
])
@pytest.mark.effect("spec.engine.overlapSchedule", "spec.engine.tokenizerBatchDecode", "spec.model.toolCallParser",
                    "spec.model.reasoningParser", "spec.model.chatTemplate", "spec.model.trustRemoteCode",
                    "spec.decode.dp", "spec.decode.nodesPerGroup", "spec.transfer.ibDevice", "spec.engine.extraArgs")
def test_typed_fields_become_their_flags(patch: dict[str, Any], role: Role, kwargs: dict[str, Any],
                                         expected_tail: list[str]) -> None:
    argv = engine_args(spec_of(patch), role, **kwargs)
    assert argv[-len(expected_tail):] == expected_tail


@pytest.mark.effect("spec.*.tp")
def test_the_tp_size_is_the_role_s_own() -> None:
    spec = spec_of({"prefill": {"tp": 4, "gpusPerNode": 4}, "decode": {"tp": 8, "gpusPerNode": 8}})
    assert engine_args(spec, Role.PREFILL)[engine_args(spec, Role.PREFILL).index("--tp-size") + 1] == "4"
    assert engine_args(spec, Role.DECODE)[engine_args(spec, Role.DECODE).index("--tp-size") + 1] == "8"


def test_a_volume_model_uses_the_mount_path_the_pod_renderer_chose() -> None:
    spec = spec_of({"model": {"source": {"path": None, "pvc": {"claimName": "weights", "subPath": "m"}}}})
    argv = engine_args(spec, Role.DECODE, model_path="/models/m")
    assert argv[argv.index("--model-path") + 1] == "/models/m"


def test_a_volume_model_without_a_mount_path_is_a_programming_error() -> None:
    spec = spec_of({"model": {"source": {"path": None, "hostPath": {"path": "/mnt/m"}}}})
    with pytest.raises(ValueError, match="pass model_path"):
        engine_args(spec, Role.DECODE)


def test_a_multi_node_group_needs_the_rendezvous_address_and_a_valid_rank() -> None:
    spec = spec_of({"decode": {"tp": 16, "gpusPerNode": 8, "nodesPerGroup": 2}})
    with pytest.raises(ValueError, match="dist_init_addr"):
        engine_args(spec, Role.DECODE, node_rank=0)
    with pytest.raises(ValueError, match="node_rank 2"):
        engine_args(spec, Role.DECODE, node_rank=2, dist_init_addr="a:5000")
    with pytest.raises(ValueError, match="dist_init_addr"):
        engine_args(spec_of({}), Role.DECODE, dist_init_addr="a:5000")


# ---- properties -------------------------------------------------------------------------------------------

_PARSERS = [None, "qwen25", "deepseekv4", "deepseekv32"]
_ports = st.integers(min_value=1, max_value=65535)


@st.composite
def _role(draw: st.DrawFn, *, prefill: bool) -> dict[str, Any]:
    nodes = draw(st.integers(min_value=1, max_value=4))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    tp = nodes * gpus
    role = {"replicas": draw(st.integers(min_value=1, max_value=8)), "tp": tp, "nodesPerGroup": nodes,
            "gpusPerNode": gpus, "dp": draw(st.sampled_from([d for d in range(1, tp + 1) if tp % d == 0])),
            "port": draw(_ports)}
    if prefill:
        role["bootstrapPort"] = draw(_ports.filter(lambda port: port != role["port"]))
    return role


_extra_arg = st.one_of(st.sampled_from(FREE_FLAGS), st.from_regex(r"[A-Za-z0-9_.:/=,]{1,12}", fullmatch=True))
_any_extra_args = st.lists(_extra_arg, max_size=12)
# Extra args as a user who knows SGLang writes them: real flags with values SGLang accepts.
_SGLANG_EXTRAS = {
    "--mem-fraction-static": st.sampled_from(["0.8", "0.85", "0.9"]),
    "--context-length": st.integers(1024, 262144).map(str),
    "--chunked-prefill-size": st.sampled_from(["-1", "4096", "8192"]),
    "--max-running-requests": st.integers(1, 4096).map(str),
    "--page-size": st.sampled_from(["1", "16", "64"]),
    "--log-level": st.sampled_from(["debug", "info", "warning"]),
    "--watchdog-timeout": st.integers(10, 3600).map(str),
    "--enable-metrics-for-all-schedulers": st.none(),
}


@st.composite
def _sglang_extra_args(draw: st.DrawFn) -> list[str]:
    out: list[str] = []
    for flag in draw(st.lists(st.sampled_from(sorted(_SGLANG_EXTRAS)), unique=True, max_size=5)):
        value = draw(_SGLANG_EXTRAS[flag])
        out += [flag] if value is None else [flag, value]
    return out


@st.composite
def valid_specs(draw: st.DrawFn, extra_args: st.SearchStrategy[list[str]] = _any_extra_args) -> InferencePoolSpec:
    """Any spec admission accepts: drawn within the rules rather than filtered, so nothing is wasted."""
    parser = draw(st.sampled_from(_PARSERS))
    source = draw(st.sampled_from([{"path": "/models/m"}, {"path": "org/model"},
                                   {"pvc": {"claimName": "weights", "subPath": "m"}}, {"hostPath": {"path": "/m"}}]))
    backend = draw(st.sampled_from(["mooncake", "nixl", "fake"]))
    transfer: dict[str, Any] = {"backend": backend}
    if backend != "fake" and draw(st.booleans()):
        transfer["ibDevice"] = draw(st.sampled_from(["mlx5_0", "mlx5_0,mlx5_1"]))
    model: dict[str, Any] = {"servedName": "m", "source": source,
                             "trustRemoteCode": draw(st.booleans())}
    if parser:
        model["toolCallParser"] = parser
    if draw(st.booleans()):
        model["reasoningParser"] = "deepseek-v3"
    if parser not in BUILT_IN_ENCODING_OF_PARSER and draw(st.booleans()):  # else a chatTemplate is refused
        model["chatTemplate"] = "/t/chat.jinja"
    raw = {
        "model": model,
        "engine": {"image": "img", "sglangVersion": "0.5.23",
                   "overlapSchedule": draw(st.sampled_from(["Enabled", "Disabled"])),
                   "tokenizerBatchDecode": draw(st.sampled_from(["Enabled", "Disabled"])),
                   "extraArgs": draw(extra_args)},
        "prefill": draw(_role(prefill=True)),
        "decode": draw(_role(prefill=False)),
        "transfer": transfer,
    }
    # Behind a router both roles serve on one port; without one they may differ.
    if draw(st.booleans()):
        raw["router"] = {"replicas": 0}
    else:
        raw["decode"]["port"] = raw["prefill"]["port"]
        if raw["prefill"]["bootstrapPort"] == raw["prefill"]["port"]:
            raw["prefill"]["bootstrapPort"] = raw["prefill"]["port"] % 65535 + 1
    return InferencePoolSpec.model_validate(raw)


@st.composite
def rendered(draw: st.DrawFn, extra_args: st.SearchStrategy[list[str]] = _any_extra_args,
             ) -> tuple[InferencePoolSpec, Role, list[str]]:
    spec = draw(valid_specs(extra_args))
    role = draw(st.sampled_from(list(Role)))
    nodes = spec.role(role).nodes_per_group
    rank = draw(st.integers(min_value=0, max_value=nodes - 1))
    argv = engine_args(spec, role, node_rank=rank, model_path="/models/m",
                       dist_init_addr="leader.group.ns.svc:5000" if nodes > 1 else None)
    return spec, role, argv


@settings(max_examples=300, deadline=None)
@given(rendered())
def test_every_managed_flag_appears_at_most_once_and_the_always_flags_exactly_once(
        case: tuple[InferencePoolSpec, Role, list[str]]) -> None:
    spec, _, argv = case
    managed = flags(argv[: len(argv) - len(spec.engine.extra_args)])
    for flag in ALWAYS:
        assert managed.count(flag) == 1, flag
    assert len(managed) == len(set(managed))
    for flag in MANAGED_FLAGS:
        assert flags(argv).count(flag) <= 1, flag


@settings(max_examples=300, deadline=None)
@given(rendered())
def test_extra_args_follow_the_managed_flags_unchanged_and_in_order(
        case: tuple[InferencePoolSpec, Role, list[str]]) -> None:
    spec, _, argv = case
    extra = list(spec.engine.extra_args)
    assert argv[len(argv) - len(extra):] == extra


@settings(max_examples=200, deadline=None)
@given(rendered())
def test_every_flag_the_renderer_writes_is_refused_in_extra_args(
        case: tuple[InferencePoolSpec, Role, list[str]]) -> None:
    spec, _, argv = case
    for flag in flags(argv[: len(argv) - len(spec.engine.extra_args)]):
        assert flag in MANAGED_FLAGS, f"{flag} is rendered but a user could also pass it in extraArgs"


@settings(max_examples=200, deadline=None)
@given(rendered(_sglang_extra_args()))
def test_sglang_s_own_parser_accepts_every_derived_command_line(
        case: tuple[InferencePoolSpec, Role, list[str]]) -> None:
    from tests.support import sglang_args

    spec, role, argv = case
    parsed = sglang_args.parse_server_args(argv)
    role_spec = spec.role(role)
    assert parsed.tp_size == role_spec.tp
    assert parsed.disaggregation_mode == str(role)
    assert parsed.port == role_spec.port
    assert parsed.disable_overlap_schedule == (spec.engine.overlap_schedule == "Disabled")
