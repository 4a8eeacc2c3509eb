"""Why `--config` is refused in spec.engine.extraArgs: SGLang 0.5.23's own config merger turns a YAML file into
command-line options before its parser runs, so a file could switch on what admission refuses flag by flag."""

from __future__ import annotations

import argparse
import pathlib

from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

from pdfleet.operator.api import flags


def test_sglangs_config_file_sets_flags_admission_refuses_one_by_one(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("enable-lora: true\nenable-flexkv: true\nradix-cache-backend: flexkv\n")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = ConfigArgumentMerger(parser).merge_config_with_args(["--model-path", "m", "--config", str(config)])
    parsed = parser.parse_args(argv)
    assert parsed.enable_lora and parsed.enable_flexkv and parsed.radix_cache_backend == "flexkv", \
        "the file switched on what extraArgs may not"
    assert all(flags.reserved_flag(arg) for arg in ("--enable-lora", "--enable-flexkv", "--radix-cache-backend"))
    assert flags.reserved_flag("--config") == "--config" and flags.reserved_flag("--conf=x.yaml") == "--config"
    # The options beside it that merely start alike stay free.
    assert flags.reserved_flag("--context-length") is None
    assert flags.reserved_flag("--constrained-json-whitespace-pattern") is None
