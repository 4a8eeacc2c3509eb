"""`pdfleet-engine`: start SGLang with pdfleet's patches and rank-health agent.

    python -m pdfleet.runtime.launcher [--patch ID]... [--agent-port N] [--metrics-port N] [--check] -- <sglang args>
    python -m pdfleet.runtime.launcher patches        # the catalogue

Before anything starts, the SGLang arguments go through SGLang's own parser and every selected patch is
checked against the installed SGLang (known id, version range, every target function's fingerprint). Any
problem stops the launch with one message and exit code 2: an engine that would run unpatched or half-patched
code is never started. `--check` stops after the checks (used by tests and by `kubectl debug` sessions).

Every engine also gets pdfleet's rank instrumentation (`pdfleet.runtime.instrument`), verified the same way,
and the pod's rank-health agent on `--agent-port` (`/ranks`, `/ranks/stacks`, `/livez`; 0: no agent), served
from a daemon thread of this process, which is SGLang's main process: same pid namespace as the ranks, same
ledger path. With `--metrics-port`, a metrics-only port beside it (`pdfleet.runtime.metrics_relay`: the engine's own
`GET /metrics` and nothing else, for a Prometheus that must not reach the engine's API; 0, the default: none). The
launcher starts each engine with an empty ledger and records the engine's URL beside it for the preStop drain
(`pdfleet.runtime.drain`).

Every engine refuses, always, the requests of SGLang's HTTP server that desync a TP group
(`pdfleet.runtime.refused_routes`, its targets verified the same way): the run-time weight updates (roll out
spec.model instead), NGRAM corpora, weight process groups, memory release and HiCache storage attach/detach answer
403 with the reason and never reach SGLang's tokenizer manager. `patches` lists them after the catalogue. Every
engine also answers `/server_info` with SGLang's API keys redacted (`pdfleet.runtime.server_info_redaction`).

Listeners bind to $PDFLEET_BIND_ADDRESS when set (the pod's own IP, where pods share a network namespace, as
on the local fleet), else to SGLang's `--host`. With PDFLEET_ENGINE_MODE=simulate, everything above happens
and then the engine simulator (`pdfleet.runtime.simulator`) serves instead of SGLang's `run_server`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from pdfleet.runtime import drain, engine_config, engine_setup, metrics_relay, refused_routes, server_info_redaction
from pdfleet.runtime.health import agent, ledger
from pdfleet.runtime.instrument import rank_seams
from pdfleet.runtime.patches import base, catalogue

EXIT_USAGE = 2
BIND_ENV = "PDFLEET_BIND_ADDRESS"
MODE_ENV = "PDFLEET_ENGINE_MODE"
SIMULATE = "simulate"
BOOTSTRAP = Path(__file__).resolve().parent / "bootstrap"


def sglang_import_problem() -> str | None:
    """One line when SGLang does not import: not installed in this Python, or installed without something it
    needs (torch, say). The launcher's first use of SGLang is its argument parser: checked here, so that either
    case is a message instead of a traceback."""
    try:
        import sglang.srt.server_args  # noqa: F401
    except ImportError as e:
        missing = e.name or ""
        if missing == "sglang" or missing.startswith("sglang."):
            problem = "SGLang is not installed"
        else:
            problem = f"SGLang does not import ({e})"
        # The instrumentation refuses any SGLang it has no fingerprints of: name the newest it knows.
        newest = max(rank_seams.FINGERPRINTS, key=catalogue.version_key)
        return (f"{problem} in {sys.executable}: run pdfleet-engine in an SGLang image, "
                f"or `pip install sglang=={newest}` into that Python")
    return None


def list_patches() -> str:
    rows = []
    for p in catalogue.CATALOGUE:
        fixed = f", fixed upstream in {p.fixed_in}" if p.fixed_in else ""
        fixed += f"; not implemented by pdfleet yet: {p.unavailable}" if p.unavailable else ""
        rows.append(f"{p.id}\n  SGLang {p.applies_to}{fixed}\n  {p.summary}\n  replaces: {', '.join(p.targets)}")
    return "\n".join([*rows, refused_routes.describe()])


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    sglang_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="pdfleet-engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["run", "patches"], default="run")
    parser.add_argument("--patch", action="append", default=[], metavar="ID", help="apply this catalogue patch")
    parser.add_argument("--agent-port", type=int, default=agent.DEFAULT_PORT,
                        help="port of the rank-health agent (0: none)")
    parser.add_argument("--metrics-port", type=int, default=0,
                        help=f"port that relays only the engine's GET /metrics (0: none; pods use "
                             f"{metrics_relay.DEFAULT_PORT})")
    parser.add_argument("--check", action="store_true", help="check arguments and patches, start nothing")
    return parser.parse_args(own), sglang_args


class _QuietParser(argparse.ArgumentParser):
    """SGLang's parser, made to raise instead of printing its 300-line usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise base.PatchError(f"SGLang refuses its arguments: {message}")


def parse_sglang_args(sglang_args: list[str]) -> argparse.Namespace:
    """SGLang's own parser, so a bad flag fails here, with SGLang's message, before anything starts; a --config
    file merged in first as SGLang merges it, and refused when it sets what pdfleet owns (`engine_config`)."""
    from sglang.srt.server_args import ServerArgs

    parser = _QuietParser(prog="sglang", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    try:
        resolved = engine_config.resolve(sglang_args, parser)
    except engine_config.ConfigError as e:
        raise base.PatchError(str(e)) from None
    try:
        return parser.parse_args(resolved)
    except argparse.ArgumentError as e:
        raise base.PatchError(f"SGLang refuses its arguments: {e}") from None


def export_for_children(patch_ids: list[str]) -> None:
    """What SGLang's spawned processes need to patch themselves (see runtime/bootstrap/sitecustomize.py)."""
    os.environ["PDFLEET_PATCHES"] = ",".join(patch_ids)
    path = os.environ.get("PYTHONPATH", "")
    if str(BOOTSTRAP) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP), path) if p)


def bind_address(sglang: argparse.Namespace) -> str:
    """Where this engine's listeners bind: the pod's address when the environment names it, else `--host`."""
    return os.environ.get(BIND_ENV) or str(sglang.host)


def start_agent(port: int, *, host: str = "0.0.0.0", patches: Sequence[str] = ()) -> agent.Agent | None:
    """The pod's rank-health agent on `port` (None for port 0), reading this engine's ledger and saying which
    catalogue patches the engine applied."""
    if port == 0:
        return None
    return agent.Agent(ledger.default_path(), host=host, port=port, patches=tuple(patches)).start()


def start_metrics_relay(port: int, sglang: argparse.Namespace) -> metrics_relay.MetricsRelay | None:
    """The pod's metrics-only port (None for port 0), bound where the agent binds, relaying this engine's
    /metrics from the address the engine listens on, as seen from inside the pod."""
    if port == 0:
        return None
    host = bind_address(sglang)
    return metrics_relay.MetricsRelay.for_engine_url(drain.local_url(host, sglang.port), host=host, port=port).start()


def prepare_pod_state(sglang: argparse.Namespace) -> None:
    """A fresh ledger for this engine (a stale one may have another geometry, which ranks would refuse), and
    the engine's URL for the drain."""
    ledger.default_path().unlink(missing_ok=True)
    drain.write_endpoint(drain.local_url(bind_address(sglang), sglang.port))


def main(argv: Sequence[str] | None = None) -> int:
    options, sglang_args = parse(sys.argv[1:] if argv is None else argv)
    if options.command == "patches":
        print(list_patches())
        return 0
    if (problem := sglang_import_problem()) is not None:
        print(f"pdfleet-engine: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        version = engine_setup.sglang_version()
        base.check(options.patch, version)
        parsed = parse_sglang_args(sglang_args)
        applied = engine_setup.apply_selected(options.patch)
        applied.append(refused_routes.install(version))
        applied.append(server_info_redaction.install(version))
    except base.PatchError as e:
        print(f"pdfleet-engine: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"pdfleet-engine: SGLang {version}; patches: {', '.join(a.id for a in applied) or 'none'}",
          file=sys.stderr)
    if options.check:
        return 0
    export_for_children(options.patch)
    prepare_pod_state(parsed)
    try:
        running = start_agent(options.agent_port, host=bind_address(parsed),
                              patches=list(dict.fromkeys(options.patch)))
    except OSError as e:  # the port is taken: without its agent the pod would fail its liveness probe anyway
        print(f"pdfleet-engine: the rank-health agent cannot listen on port {options.agent_port}: {e}",
              file=sys.stderr)
        return EXIT_USAGE
    if running is not None:
        print(f"pdfleet-engine: rank-health agent on port {running.port}", file=sys.stderr)
    try:
        relay = start_metrics_relay(options.metrics_port, parsed)
    except OSError as e:  # as for the agent: a pod without its metrics port would scrape as down, unexplained
        print(f"pdfleet-engine: the metrics relay cannot listen on port {options.metrics_port}: {e}", file=sys.stderr)
        return EXIT_USAGE
    if relay is not None:
        print(f"pdfleet-engine: metrics relay on port {relay.port} (GET /metrics of the engine only)",
              file=sys.stderr)
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    # As `python -m sglang.launch_server` does: plugins first, and never leave scheduler ranks behind.
    load_plugins()
    try:
        if os.environ.get(MODE_ENV) == SIMULATE:
            from pdfleet.runtime import simulator

            return simulator.run(parsed, sglang_args, bind=bind_address(parsed))
        run_server(prepare_server_args(sglang_args))
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
