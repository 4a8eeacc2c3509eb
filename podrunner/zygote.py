"""The zygote: a long-lived child of the runner that imports SGLang and pdfleet's runtime once, then forks
one process per container, so an engine pod starts in milliseconds instead of the 10-20 s an import takes.

It never starts a thread (a fork copies only the calling thread, and a lock held by another one would stay
locked forever in the child). It talks JSON lines: requests on stdin, replies on stdout, and since it is the
parent (and child subreaper) of every container process, it reaps them all and reports each exit.

    {"op": "spawn", "id": ..., "mode": "launch"|"module"|"exec", "argv": [...], "env": {...}, "cwd": ..., "log": ...}
        launch: pdfleet's launcher with argv; module: `python -m argv[0] argv[1:]`; exec: argv as a program.
        Optional "stderr": a file for standard error apart from the log.
        -> {"op": "spawned", "id": ..., "pid": N} or {"op": "spawn-failed", "id": ..., "error": ...}
    {"op": "signal", "pid": N, "signal": S}   (to the process group of a process it spawned)
    -> {"op": "exit", "pid": N, "code": C|null, "signal": S|null}   (once a spawned process and its whole
                                                                     process group are gone)
    -> {"op": "ready", "imported": [...], "seconds": T}               (once, after the imports)
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import sys
import time
import traceback
import warnings
from typing import Any

PRELOAD = (
    "sglang.srt.server_args",
    "sglang.srt.managers.scheduler",
    "sglang.srt.disaggregation.prefill",
    "sglang.srt.disaggregation.decode",
    "pdfleet.runtime.launcher",
    "pdfleet.runtime.engine_setup",
)
# The engine simulator, once it exists; sglang-router's entry point (which imports SGLang), for router pods.
OPTIONAL = ("pdfleet.runtime.simulator", "sglang_router.launch_router")
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    _libc.prctl(option, value, 0, 0, 0)


def _send(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def preload() -> list[str]:
    loaded = []
    for name in PRELOAD:
        importlib.import_module(name)
        loaded.append(name)
    for name in OPTIONAL:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except ModuleNotFoundError as e:
            if e.name is None or not name.startswith(e.name):
                raise
    return loaded


def _child(request: dict[str, Any], control: list[int]) -> None:
    """In the forked child: become the container's process and never return."""
    code = 1
    try:
        os.setsid()  # its own process group: the runner signals the container as a group
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a dead zygote takes its containers with it
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        if request["mode"] != "exec":
            # A forked container goes on as the Python process `python3 -m ...` would have been, and Python
            # ignores SIGPIPE from its start: a client that hangs up mid-answer is an error to handle, not a
            # signal that kills the engine (it did, before this line).
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        for fd in control:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # Standard error goes to the log too unless the request names a file of its own for it.
        err = os.open(request["stderr"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) \
            if request.get("stderr") else log
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(err, 2)
        os.close(null)
        os.close(log)
        if err != log:
            os.close(err)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = list(request["argv"])
        if request["mode"] == "exec":
            try:
                os.execvpe(argv[0], argv, request["env"])
            except OSError as e:
                os.write(2, f"pdfleet-sim: cannot run {argv[0]}: {e}\n".encode())
                os._exit(127)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's own stdout)
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        if request["mode"] == "module":
            # As `python -m` runs it, over what the zygote imported: the test suite's desync reproductions
            # start this way, each saving the 10-20 s an import of SGLang takes.
            sys.argv = list(argv)
            sys.path.insert(0, request["cwd"])  # what `python -m` puts first
            # runpy warns when the module is already imported, as every preloaded one is: re-running it as
            # __main__ is the point here, and `python -m` would have printed nothing.
            warnings.filterwarnings("ignore", r".* found in sys\.modules after import of package", RuntimeWarning)
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
            code = 0
        else:
            sys.argv = ["pdfleet-engine", *argv]
            from pdfleet.runtime import launcher

            code = launcher.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # never the zygote's own atexit handlers or buffers


GROUP_GONE_WITHIN_S = 10.0  # after its leader's exit and a SIGKILL, a group left alive longer is reported gone
POLL_ENDING_S = 0.05


class Zygote:
    """A container ends as a pid namespace does: when its first process exits, every other process of its
    group is killed, and the exit is reported only once none is left. Until then they may still hold the
    pod's ports, and a container started again at once (a restart, or a new pod on the same IP) would find
    them taken."""

    def __init__(self) -> None:
        self.children: set[int] = set()
        self.groups: set[int] = set()  # process groups it made; signalled even after the leader is reaped
        # Groups whose leader has exited: the leader's exit, kept until the rest of the group is gone.
        self.ending: dict[int, tuple[int | None, int | None, float]] = {}
        self.out = os.fdopen(os.dup(1), "w")
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)

    def spawn(self, request: dict[str, Any]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as e:
            _send(self.out, {"op": "spawn-failed", "id": request["id"], "error": str(e)})
            return
        if pid == 0:
            _child(request, [self.out.fileno(), self.wake_r, self.wake_w])
        self.children.add(pid)
        self.groups.add(pid)
        _send(self.out, {"op": "spawned", "id": request["id"], "pid": pid})

    def signal(self, pid: int, sig: int) -> None:
        if pid not in self.groups:
            return
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            if pid in self.children:
                # Forked but not its own group yet (the child's first act is setsid): the child alone is all there
                # is of the container. Forgetting the group here would drop the SIGKILL that ends a grace period,
                # and the pod would stay Terminating.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                return
            self.groups.discard(pid)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid not in self.children:
                continue  # an orphaned grandchild (engine ranks, say) reparented to this subreaper
            self.children.discard(pid)
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            self.ending[pid] = (code, sig, time.monotonic())
            self.signal(pid, signal.SIGKILL)

    def report_ended(self) -> None:
        """Reports the exit of every group whose last process is gone (reaped: a zombie still counts)."""
        for pid, (code, sig, since) in list(self.ending.items()):
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                pass
            else:
                if time.monotonic() - since < GROUP_GONE_WITHIN_S:
                    continue
                print(f"pdfleet-sim zygote: process group {pid} outlived its leader by {GROUP_GONE_WITHIN_S:.0f} s "
                      "and a SIGKILL; reporting the container's exit anyway", file=sys.stderr, flush=True)
            del self.ending[pid]
            self.groups.discard(pid)
            _send(self.out, {"op": "exit", "pid": pid, "code": code, "signal": sig})

    def handle(self, line: str) -> None:
        request = json.loads(line)
        if request["op"] == "spawn":
            self.spawn(request)
        elif request["op"] == "signal":
            self.signal(int(request["pid"]), int(request["signal"]))

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the wakeup fd
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the runner stops containers first, then closes stdin
        buffer = b""
        stdin = sys.stdin.fileno()
        while True:
            readable, _, _ = select.select([stdin, self.wake_r], [], [], POLL_ENDING_S if self.ending else None)
            if self.wake_r in readable:
                while True:
                    try:
                        if not os.read(self.wake_r, 512):
                            break
                    except BlockingIOError:
                        break
            self.reap()
            self.report_ended()
            if stdin in readable:
                chunk = os.read(stdin, 65536)
                if not chunk:
                    return  # the runner is gone or done
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self.handle(line.decode())


def main() -> int:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # never outlive the runner
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    zygote = Zygote()
    # Replies own the real stdout; anything an import prints goes to stderr (the runner's log).
    os.dup2(2, 1)
    started = time.monotonic()
    imported = preload()
    _send(zygote.out, {"op": "ready", "imported": imported, "seconds": round(time.monotonic() - started, 2)})
    zygote.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
