"""An SGLang config file (`--config FILE` in `spec.engine.extraArgs`), resolved and checked before the engine starts.

SGLang merges a YAML file of options into its command line before its parser runs (config first, so the command
line wins). A file could thereby set what admission refuses in `extraArgs` flag by flag (`enable-lora: true`), a
flag the operator owns and leaves at its default (`disable-overlap-schedule`), or a KV-layout flag the operator
must see (`page-size`). So the launcher merges the file with SGLang's own merger, over SGLang's own parser, exactly
as `prepare_server_args` will, and refuses any option the file sets that the engine flag table (`engine_flags`)
owns, refuses or counts as layout, naming it. What is left is what `extraArgs` could have said.

SGLang merges only the exact two-argument form `--config FILE`: `--config=FILE`, or an abbreviation such as
`--conf FILE`, reaches its parser as a plain option, and the file is silently ignored. Those forms are refused too.
"""

from __future__ import annotations

import argparse

from pdfleet.runtime.engine_flags import FLAGS, layout_flag, option_name, reserved_flag

CONFIG = "--config"


class ConfigError(Exception):
    """The config file cannot be used: unreadable, not SGLang's format, or setting what pdfleet owns or refuses."""


def resolve(sglang_args: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`sglang_args` with the config file's options merged in as SGLang merges them (unchanged without one), or
    ConfigError saying what is wrong. `parser`: SGLang's, with its `ServerArgs.add_cli_args` options."""
    for arg in sglang_args:
        name = option_name(arg)
        if arg != CONFIG and len(name) > 2 and arg.startswith("--") and CONFIG.startswith(name):
            raise ConfigError(f"{arg!r}: SGLang reads a config file only as the two arguments '--config FILE' "
                              "(with '=' or abbreviated, it would ignore the file); write it that way")
    if CONFIG not in sglang_args:
        return list(sglang_args)
    import yaml  # SGLang's own dependency, for its merger
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    try:
        merged = ConfigArgumentMerger(parser).merge_config_with_args(list(sglang_args))
    except (ValueError, OSError, yaml.YAMLError) as e:
        raise ConfigError(f"SGLang cannot read the --config file: {' '.join(str(e).split())}") from None
    path = sglang_args[sglang_args.index(CONFIG) + 1]
    from_file = merged[:len(merged) - (len(sglang_args) - 2)]  # the merger puts the file's options first
    owned = [flag for arg in from_file if (flag := reserved_flag(arg) or layout_flag(option_name(arg))) is not None]
    if owned:
        reasons = "; ".join(f"{flag}: {_why(flag)}" for flag in dict.fromkeys(owned))
        raise ConfigError(f"the --config file {path} sets what a pdfleet engine may not take from it ({reasons}); "
                          "a config file may set only what spec.engine.extraArgs may")
    return merged


def _why(flag: str) -> str:
    if layout_flag(flag) is not None:
        return ("it shapes the KV layout, which the operator must see to keep old and new layouts from serving one "
                "router: put it in spec.engine.extraArgs")
    entry = FLAGS[flag]
    if entry.unchecked is not None and entry.unchecked.startswith("refused"):
        return entry.unchecked
    return f"set from {entry.owner}"
