"""What a well-behaved engine's /server_info shows of the compared fields, read from its pod's command line, for
tests whose engines are fakes. Real SGLang reads the same command line with its argparse; this reads only the
operator-owned flags the serverArgs gate compares, typed as /server_info reports them
(`test_verification` checks it against SGLang's own `prepare_server_args`)."""

from __future__ import annotations

from typing import Any

from pdfleet.operator.planning.rollout.verification import SERVER_ARG_FIELDS, SWITCHED

Body = dict[str, Any]


def engine_command(pod: Body) -> list[str]:
    """The SGLang arguments rendered into an engine pod (after the launcher's `--`)."""
    for container in pod["spec"]["containers"]:
        args = list(container.get("args") or [])
        if "--" in args:
            return args[args.index("--") + 1:]
    return []


def shown(command: list[str]) -> dict[str, Any]:
    """ServerArgs field -> value of every compared flag on `command`; switches absent from it show False."""
    out: dict[str, Any] = {}
    for i, arg in enumerate(command):
        name, eq, inline = arg.partition("=")
        if name not in SERVER_ARG_FIELDS:
            continue
        field, kind = SERVER_ARG_FIELDS[name]
        if kind is bool:
            out[field] = True
        else:
            out[field] = kind(inline if eq else (command[i + 1] if i + 1 < len(command) else ""))
    for flag in SWITCHED:
        out.setdefault(SERVER_ARG_FIELDS[flag][0], False)
    return out


def shown_by(pod: Body) -> dict[str, Any]:
    """What the engine of `pod` shows, as SGLang would parse the pod's command line."""
    return shown(engine_command(pod))
