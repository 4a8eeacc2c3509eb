"""`pdfleet` (and `kubectl-pdfleet`, so `kubectl pdfleet ...` works as a kubectl plugin): a pool's status and its
rollout, for people. Wiring only: the reads are in `cli/kube.py`, what is printed and the exit code in
`cli/report.py`."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import shutil
import sys
from typing import TextIO

from pdfleet.operator.api import checks
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.cli import canary, report
from pdfleet.operator.cli.kube import Body, CliError, PoolReader, connect, default_namespace
from pdfleet.operator.cli.report import Exit
from pdfleet.operator.planning import spec_change
from pdfleet.operator.planning.rollout import rollback
from pdfleet.operator.planning.spec_change import REMOVE, SpecChange

EPILOG = """exit codes of `rollout status`: 0 the rollout completed verified (RolloutVerified=True and
currentRevision == updateRevision); 1 it failed (a verification gate failed or timed out, phase Failed, the spec
was rejected), the pool was deleted, or --timeout passed; 2 usage, kubeconfig, connection or permission errors,
or the pool does not exist; 3 still in progress (without --watch). `rollout undo|pause|resume`: 0 done (or
already paused / not paused), 1 nothing to undo to (no verified revision recorded, or the pool already has it) or
the spec changed while the command ran, 2 as above."""


def _timeout(text: str) -> float | None:
    """kubectl's --timeout: a duration (30s, 5m, 1h30m); 0 waits forever."""
    if text.strip() in ("0", "0s"):
        return None
    try:
        seconds = parse_duration(text).total_seconds()
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return seconds or None


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("pool", metavar="POOL", help="the InferencePool's name")
    common.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig context's, or default)")
    common.add_argument("--kubeconfig", help="the kubeconfig to use (default: KUBECONFIG, then ~/.kube/config)")

    top = argparse.ArgumentParser(prog="pdfleet", description="Follow pdfleet InferencePools: their status and "
                                  "their verified rollouts; check a server's tool calls (canary).", epilog=EPILOG)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("status", parents=[common], help="phase, revisions, groups per role, conditions that are "
                        "not fine, the last incident",
                        description="The pool's phase and revisions, per role its groups (revision, verdict, "
                                    "Ready pods, verified or the gate waited on, restarts), the conditions that "
                                    "are not fine, and the last incident (the newest Warning Event and evidence "
                                    "ConfigMap).")
    rollout = commands.add_parser("rollout", help="the pool's rollout").add_subparsers(
        dest="rollout_command", required=True, metavar="COMMAND")
    status = rollout.add_parser("status", parents=[common], epilog=EPILOG,
                                help="steps done/total, the gate waited on; exits like kubectl rollout status",
                                description="Steps done/total (groups of the update revision verified / groups "
                                            "desired), a progress bar on a terminal, the gate being waited on.")
    status.add_argument("-w", "--watch", action="store_true",
                        help="follow the pool until the rollout completes verified or fails")
    status.add_argument("--timeout", type=_timeout, default=None, metavar="DURATION",
                        help="with --watch: give up after this long (30s, 5m, 1h30m; 0, the default, waits "
                             "forever)")
    undo = rollout.add_parser("undo", parents=[common], epilog=EPILOG,
                              help="back to a verified revision (the engine-shaping spec it recorded)",
                              description="Patches the engine-shaping part of the spec (model, engine, transfer, "
                                          "each role but its replicas) back to a revision every group of which "
                                          "passed verification: the newest one the pool does not have now, or the "
                                          "one --to-revision names (see `pdfleet rollout history`); the operator "
                                          "rolls it out verified. Follow it with `pdfleet rollout status POOL "
                                          "--watch`.")
    undo.add_argument("--to-revision", metavar="REVISION", help="a revision of `pdfleet rollout history`")
    rollout.add_parser("history", parents=[common],
                       help="the verified revisions recorded, oldest first",
                       description="The revisions every group of which passed verification, oldest first, when "
                                   "each was verified, and which the pool runs now (annotation "
                                   "pdfleet.dev/verified-history, the last 10).")
    rollout.add_parser("pause", parents=[common], epilog=EPILOG,
                       help="start no new group replacement (spec.rollout.paused: true)",
                       description="Sets spec.rollout.paused: no new group replacement starts; replacements "
                                   "already started finish and are verified.")
    rollout.add_parser("resume", parents=[common], epilog=EPILOG, help="continue a paused rollout",
                       description="Removes spec.rollout.paused: the rollout continues.")
    canary.add_parser(commands)
    return top


def _paused(pool: Body) -> bool:
    spec, _ = checks.validate_pool(pool)
    return spec is not None and spec.rollout.paused


def _plan_change(command: str, pool: Body, name: str, to_revision: str | None = None) -> SpecChange | str:
    """The patch a rollout command makes, or what to say instead (str: done already, exit 0), or raises
    NothingToUndo."""
    if command == "undo":
        return rollback.undo(pool, datetime.datetime.now(datetime.UTC), to_revision)
    if command == "pause":
        return f"InferencePool {name} is already paused" if _paused(pool) else \
            spec_change.patch(pool, {("spec", "rollout", "paused"): True}, why="pdfleet rollout pause") or ""
    return f"InferencePool {name} is not paused" if not _paused(pool) else \
        spec_change.patch(pool, {("spec", "rollout", "paused"): REMOVE}, why="pdfleet rollout resume") or ""


async def change_rollout(reader: PoolReader, command: str, out: TextIO, to_revision: str | None = None) -> int:
    """`pdfleet rollout undo|pause|resume`: one patch of the pool as read, refused if its spec changed since."""
    pool = await reader.pool()
    name = f"{reader.namespace}/{reader.name}"
    try:
        change = _plan_change(command, pool, name, to_revision)
    except rollback.NothingToUndo as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.FAILED
    if isinstance(change, str):
        print(change, file=out)
        return Exit.COMPLETE
    if await reader.change(pool, change) is None:
        print(f"error: the spec of InferencePool {name} changed while `rollout {command}` ran: nothing was "
              f"changed; run it again", file=sys.stderr)
        return Exit.FAILED
    done = {"undo": f"rolled back to {report.undo_label(pool, to_revision) if command == 'undo' else ''}; follow "
                    f"it with `pdfleet rollout status {reader.name} -n {reader.namespace} --watch`",
            "pause": "paused: no new group replacement starts; replacements already started finish",
            "resume": "resumed"}[command]
    print(f"InferencePool {name} {done}", file=out)
    return Exit.COMPLETE


async def show_status(reader: PoolReader, out: TextIO) -> int:
    pool = await reader.pool()
    pods, events, evidence, targets = await asyncio.gather(reader.pods(), reader.warnings(), reader.evidence(),
                                                           reader.scale_targets())
    now = datetime.datetime.now(datetime.UTC)
    for line in report.status_lines(pool, pods=pods, events=events, evidence=evidence, scale_targets=targets,
                                    now=now):
        print(line, file=out)
    return 0


class Printer:
    """Prints a rollout line when it changes: on a terminal one line rewritten in place, else one line each."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out, self.tty, self.last, self.open = out, tty, "", False

    def show(self, line: str, *, final: bool) -> None:
        if line == self.last:
            return
        self.last = line
        if self.tty:
            # A line longer than the terminal would wrap, and only its last row be rewritten: cut it until the end.
            width = shutil.get_terminal_size().columns - 1
            self.out.write("\r\033[K" + (line if final or len(line) <= width else line[:width - 1] + "…"))
            self.open = True
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def end(self) -> None:
        if self.open:
            self.out.write("\n")
            self.out.flush()
            self.open = False


async def follow(reader: PoolReader, printer: Printer, *, watch: bool) -> int:
    """Prints the rollout's state, and with `watch` follows the pool's watch until it completes or fails."""
    def show(pool: Body) -> report.Rollout:
        state = report.rollout(pool)
        printer.show(report.rollout_line(pool, state, tty=printer.tty), final=state.outcome is not Exit.IN_PROGRESS)
        return state

    pool = await reader.pool()
    state = show(pool)
    while watch and state.outcome is Exit.IN_PROGRESS:
        async for event in reader.watch(pool["metadata"]["resourceVersion"]):
            if event.get("type") == "DELETED":
                printer.end()
                print(f"error: InferencePool {reader.namespace}/{reader.name} was deleted", file=sys.stderr)
                return Exit.FAILED
            if event.get("type") not in ("ADDED", "MODIFIED"):
                continue
            pool = event["object"]
            state = show(pool)
            if state.outcome is not Exit.IN_PROGRESS:
                break
        else:  # the apiserver ended the watch (or the version was too old to watch from): read afresh
            pool = await reader.pool()
            state = show(pool)
    printer.end()
    return state.outcome


async def run(args: argparse.Namespace, out: TextIO) -> int:
    namespace = args.namespace or default_namespace(args.kubeconfig)
    client, host = await connect(args.kubeconfig)
    try:
        reader = PoolReader(client, host, namespace, args.pool)
        if args.command == "status":
            return await show_status(reader, out)
        if args.rollout_command == "history":
            for line in report.history_lines(await reader.pool()):
                print(line, file=out)
            return Exit.COMPLETE
        if args.rollout_command != "status":
            return await change_rollout(reader, args.rollout_command, out, getattr(args, "to_revision", None))
        printer = Printer(out, tty=out.isatty())
        try:
            async with asyncio.timeout(args.timeout if args.watch else None):
                return await follow(reader, printer, watch=args.watch)
        except TimeoutError:
            printer.end()
            print(f"error: timed out after {args.timeout:g}s waiting for the rollout of InferencePool "
                  f"{namespace}/{args.pool}", file=sys.stderr)
            return Exit.FAILED
    finally:
        await client.close()


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "canary":  # talks to a server's OpenAI API, not to Kubernetes
            return canary.run(args, out or sys.stdout)
        return asyncio.run(run(args, out or sys.stdout))
    except (CliError, report.Unreadable) as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went (`| head`): say nothing more, and keep Python from failing to flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return Exit.ERROR


if __name__ == "__main__":
    sys.exit(main())
