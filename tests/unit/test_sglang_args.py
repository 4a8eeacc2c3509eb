"""tests.support.sglang_args against the real sglang 0.5.23 parser (install: hack/install-sglang.sh)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.sglang_args import (
    SGLangArgsError,
    build_server_args,
    parse_server_args,
    resolve_server_args,
)

PD_DECODE = [
    "--model-path", "/models/x",
    "--tp-size", "8",
    "--disaggregation-mode", "decode",
    "--disaggregation-transfer-backend", "fake",
    "--host", "0.0.0.0",
    "--port", "30000",
    "--tool-call-parser", "deepseekv32",
    "--reasoning-parser", "deepseek-v3",
]  # fmt: skip

TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
}


def test_pd_decode_line_parses() -> None:
    ns = parse_server_args(PD_DECODE)
    assert ns.model_path == "/models/x"
    assert ns.tp_size == 8
    assert ns.disaggregation_mode == "decode"
    assert ns.disaggregation_transfer_backend == "fake"
    assert (ns.host, ns.port) == ("0.0.0.0", 30000)
    assert ns.tool_call_parser == "deepseekv32"
    assert ns.reasoning_parser == "deepseek-v3"
    assert ns.disable_overlap_schedule is False


def test_disable_overlap_schedule_flag() -> None:
    assert parse_server_args([*PD_DECODE, "--disable-overlap-schedule"]).disable_overlap_schedule is True


def test_unknown_flag_is_rejected_with_argparse_message() -> None:
    with pytest.raises(SGLangArgsError, match="unrecognized arguments: --no-such-flag") as info:
        parse_server_args([*PD_DECODE, "--no-such-flag"])
    assert info.value.argv[-1] == "--no-such-flag"


def test_invalid_choice_is_rejected() -> None:
    with pytest.raises(SGLangArgsError, match="invalid choice: 'sideways'"):
        parse_server_args(["--model-path", "/models/x", "--disaggregation-mode", "sideways"])


def test_missing_required_model_path_is_rejected() -> None:
    with pytest.raises(SGLangArgsError, match="model-path"):
        parse_server_args(["--tp-size", "8"])


def test_build_server_args_needs_no_gpu_and_no_model() -> None:
    server_args = build_server_args(PD_DECODE)
    assert type(server_args).__name__ == "ServerArgs"
    assert server_args.tp_size == 8
    assert server_args.disaggregation_mode == "decode"
    assert server_args.device is None  # unresolved: from_cli_args does not resolve in 0.5.23


def test_resolution_needs_device_cpu() -> None:
    with pytest.raises(SGLangArgsError, match="--device cpu"):
        resolve_server_args(["--model-path", "dummy", "--tp-size", "8"])


def test_resolution_refuses_a_hub_model_path() -> None:
    with pytest.raises(SGLangArgsError, match="Hugging Face Hub"):
        resolve_server_args([*PD_DECODE, "--device", "cpu"])


def test_resolution_with_a_local_config_on_cpu(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    argv = [*PD_DECODE, "--device", "cpu", "--disable-overlap-schedule"]
    argv[argv.index("/models/x")] = str(tmp_path)
    environ_before = dict(os.environ)
    resolved = resolve_server_args(argv).resolved_dict()
    assert dict(os.environ) == environ_before
    assert resolved["device"] == "cpu"
    assert resolved["tp_size"] == 8
    assert resolved["disaggregation_mode"] == "decode"
    assert resolved["disable_overlap_schedule"] is True
    assert resolved["disable_radix_cache"] is True  # SGLang disables it for a decode server
    assert resolved["attention_backend"]  # derived by resolution (torch_native on a CPU without AMX)
