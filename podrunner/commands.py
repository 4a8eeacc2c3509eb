"""What a played container runs (the table in docs/local-fleet.md), pure: the pod spec in, an argv out.

The engine runs the launcher, and the router its module, inside a process forked from the zygote (which
imported both once); everything else is exec'd. `python3`
means the project's interpreter, and listeners that would bind 0.0.0.0 in their pod get the pod's IP. As
kubelet does, `$(VAR)` in command and args is replaced by the container's own env (`env.expand`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pdfleet.podrunner import env

LAUNCHER = ("python3", "-m", "pdfleet.runtime.launcher")
ROUTER = ("python3", "-m", "sglang_router.launch_router")
HOST_FLAGS = ("--host", "--prometheus-host")
ANY_ADDRESS = ("0.0.0.0", "::", "[::]")
PYTHONS = ("python3", "python")


class CommandError(ValueError):
    """The runner does not know what this container would run."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """Fork the zygote and run pdfleet's launcher with `args`."""

    args: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Module:
    """Fork the zygote and run `python -m module args` there, over what the zygote imported: sglang-router's entry
    point imports SGLang (5 s of CPU on an idle machine, 40 s on a busy one), paid once instead of at every start
    of every router container."""

    module: str
    args: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Exec:
    """Exec `argv` (argv[0] a path or a name looked up on the container's PATH)."""

    argv: tuple[str, ...]


Plan = Launch | Module | Exec


def map_python(argv: Sequence[str], python: str) -> list[str]:
    return [python if i == 0 and a in PYTHONS else a for i, a in enumerate(argv)]


def rewrite_hosts(args: Sequence[str], pod_ip: str) -> list[str]:
    """`--host 0.0.0.0`, `--host=0.0.0.0` (and --prometheus-host) become the pod's IP."""
    out: list[str] = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if eq and flag in HOST_FLAGS and value in ANY_ADDRESS:
            out.append(f"{flag}={pod_ip}")
        elif i > 0 and args[i - 1] in HOST_FLAGS and arg in ANY_ADDRESS:
            out.append(pod_ip)
        else:
            out.append(arg)
    return out


def is_chart_operator(container: Mapping[str, Any]) -> bool:
    return (container.get("name") == "operator" and not container.get("command")
            and "pdfleet-operator" in str(container.get("image", "")))


def plan(container: Mapping[str, Any], *, pod_ip: str, python: str,
         variables: Mapping[str, str] | None = None) -> Plan:
    defined = variables or {}
    command = [env.expand(str(a), defined) for a in container.get("command") or []]
    args = [env.expand(str(a), defined) for a in container.get("args") or []]
    if tuple(command) == LAUNCHER:
        return Launch(tuple(args))
    if tuple(command[:3]) == ROUTER:
        return Module(ROUTER[2], tuple(rewrite_hosts([*command[3:], *args], pod_ip)))
    if is_chart_operator(container):
        # The image's entrypoint is pdfleet-operator; argparse keeps the last --bind-address.
        return Exec((python, "-m", "pdfleet.operator", *args, f"--bind-address={pod_ip}"))
    if not command:
        raise CommandError(f"container {container.get('name')!r} has no command, and pdfleet-sim does not know "
                           f"the entrypoint of image {container.get('image')!r}")
    return Exec(tuple(map_python([*command, *args], python)))
