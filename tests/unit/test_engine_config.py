"""An SGLang config file (`--config FILE` in spec.engine.extraArgs) is resolved by the engine launcher with SGLang
0.5.23's own merger and parser, and refused when it sets what a pdfleet engine may not take from it
(runtime/engine_config.py): SGLang's merger would otherwise switch on what admission refuses flag by flag."""

from __future__ import annotations

import argparse
import pathlib

import pytest
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

from pdfleet.operator.api import checks
from pdfleet.runtime import launcher
from pdfleet.runtime.patches import base
from tests.support import forkserver
from tests.support.pools import example


def config(tmp_path: pathlib.Path, text: str, name: str = "server.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_sglangs_merger_alone_switches_on_what_admission_refuses(tmp_path: pathlib.Path) -> None:
    """Why the launcher checks: SGLang's own merger takes the file's options as if they were on the command line."""
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = ConfigArgumentMerger(parser).merge_config_with_args(
        ["--model-path", "m", "--config", config(tmp_path, "enable-lora: true\n")])
    assert parser.parse_args(argv).enable_lora


@pytest.mark.parametrize(("text", "named"), [
    ("enable-lora: true\n", "--enable-lora: refused: LoRA adapters"),
    ("enable-flexkv: true\nradix-cache-backend: flexkv\n", "--enable-flexkv: refused: FlexKV"),
    ("grpc-port: 31001\n", "--grpc-port: refused: SGLang's gRPC server"),
    ("enable-custom-logit-processor: true\n", "--enable-custom-logit-processor: refused: it runs code"),
    ("disable-overlap-schedule: true\n", "--disable-overlap-schedule: set from spec.engine.overlapSchedule"),
    ("tp-size: 2\n", "--tp-size: set from spec.<role>.tp"),
    ("page-size: 64\n", "--page-size: it shapes the KV layout, which the operator must see"),
    ("page-siz: 64\n", "--page-size: it shapes the KV layout, which the operator must see"),
])
def test_a_config_file_that_sets_an_owned_or_refused_flag_is_refused_naming_it(
        tmp_path: pathlib.Path, text: str, named: str) -> None:
    path = config(tmp_path, text)
    with pytest.raises(base.PatchError) as refused:
        launcher.parse_sglang_args(["--model-path", "/m", "--config", path])
    assert f"the --config file {path} sets what a pdfleet engine may not take from it ({named}" in str(refused.value)


def test_a_config_file_of_harmless_flags_is_merged_as_sglang_merges_it_and_the_command_line_wins(
        tmp_path: pathlib.Path) -> None:
    path = config(tmp_path, "context-length: 4096\nmem-fraction-static: 0.7\nenable-metrics-for-all-schedulers: "
                            "true\n")
    parsed = launcher.parse_sglang_args(["--model-path", "/m", "--config", path, "--mem-fraction-static", "0.8"])
    assert (parsed.context_length, parsed.mem_fraction_static, parsed.enable_metrics_for_all_schedulers) == \
        (4096, 0.8, True)


@pytest.mark.parametrize("form", [["--config=FILE"], ["--conf", "FILE"], ["--confi=FILE"]])
def test_a_config_file_sglang_would_silently_ignore_is_refused(tmp_path: pathlib.Path, form: list[str]) -> None:
    path = config(tmp_path, "enable-lora: true\n")
    args = [a.replace("FILE", path) for a in form]
    with pytest.raises(base.PatchError, match="only as the two arguments '--config FILE'"):
        launcher.parse_sglang_args(["--model-path", "/m", *args])


@pytest.mark.parametrize(("text", "name", "why"), [
    ("enable-lora: [", "server.yaml", "SGLang cannot read the --config file"),
    ("context-length: 4096\n", "server.json", "Config file must be YAML"),
])
def test_a_config_file_sglang_cannot_read_stops_the_launch_saying_why(
        tmp_path: pathlib.Path, text: str, name: str, why: str) -> None:
    with pytest.raises(base.PatchError, match=why):
        launcher.parse_sglang_args(["--model-path", "/m", "--config", config(tmp_path, text, name)])


def test_the_engine_refuses_to_start_in_one_line_naming_the_resolved_flag(tmp_path: pathlib.Path) -> None:
    path = config(tmp_path, "context-length: 4096\nenable-lora: true\n")
    result = forkserver.run("pdfleet.runtime.launcher", "--check", "--", "--model-path", "/m", "--config", path,
                            timeout=180)
    assert result.returncode == launcher.EXIT_USAGE
    assert result.stderr.strip().startswith(f"pdfleet-engine: the --config file {path} sets what a pdfleet engine "
                                            "may not take from it (--enable-lora: refused"), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.effect("spec.engine.extraArgs")
@pytest.mark.parametrize("args", [["--config", "/etc/sglang/server.yaml"], ["--admin-api-key", "k"]])
def test_admission_takes_a_config_file_and_an_admin_key_and_leaves_them_to_the_engine(args: list[str]) -> None:
    """The config file is checked at engine start; an admin key shuts SGLang's admin endpoints, with the HiCache
    storage attach and detach refused at every engine (tests/unit/test_refused_routes.py) and the key kept out of
    /server_info (tests/unit/test_server_info_redaction.py)."""
    body = example("minimal")
    body["spec"]["engine"]["extraArgs"] = args
    assert checks.validate(body) == []
