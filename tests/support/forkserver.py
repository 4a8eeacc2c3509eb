"""Python programs started as `python -m MODULE ARGS` would start them, forked from the pod runner's zygote.

The zygote (pdfleet.podrunner.zygote) imports SGLang once; every program forked from it skips the 10-20 s
that import costs on a small machine. The desync reproductions start a launcher per test this way, and the
simulated engines start as the local cluster's pod runner starts them. A started program is its own process
group and answers what tests ask of a `subprocess.Popen`: `pid`, `poll()`, `wait(timeout)`, `returncode`
(negative: the signal that ended it), `send_signal`, `terminate`, `kill`.

One zygote per test process, started on first use and ended with the process; it, and so every program it
forked, dies with the test process (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 300.0  # importing SGLang on a loaded two-core machine (180 s ran out once under make test)


class ForkServerDied(RuntimeError):
    pass


class Forked:
    """A program the zygote forked. Its exit is known once every process of its group is gone."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """To the program's first process, as `Popen.send_signal` (the zygote ends the rest of its group once
        that one exits)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        with self._server.changed:
            if not self._server.changed.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    def __init__(self, log_path: Path) -> None:
        self.changed = threading.Condition()
        self._ids = itertools.count()
        self._spawned: dict[int, int | str] = {}  # request id -> pid, or why it failed
        self._running: dict[int, Forked] = {}
        self._exits: dict[int, int] = {}  # pid -> returncode, for an exit read before its spawn reply was taken
        self._died: str | None = None
        with log_path.open("ab") as log:
            self._proc = subprocess.Popen([sys.executable, "-m", "pdfleet.podrunner.zygote"], cwd=REPO,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self.log_path = log_path
        self._reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        out: IO[bytes] = self._proc.stdout  # type: ignore[assignment]
        for line in out:
            message = json.loads(line)
            with self.changed:
                if message["op"] == "spawned":
                    self._spawned[message["id"]] = int(message["pid"])
                elif message["op"] == "spawn-failed":
                    self._spawned[message["id"]] = str(message["error"])
                elif message["op"] == "exit":
                    code = message["code"] if message["signal"] is None else -int(message["signal"])
                    forked = self._running.pop(int(message["pid"]), None)
                    if forked is None:
                        self._exits[int(message["pid"])] = code
                    else:
                        forked.returncode = code
                self.changed.notify_all()
        code = self._proc.wait()
        with self.changed:
            self._died = f"the zygote exited with {code} (log: {self.log_path})"
            for forked in self._running.values():
                forked.returncode = -9  # it took them with it (PR_SET_PDEATHSIG)
            self._running.clear()
            self.changed.notify_all()

    def spawn(self, module: str, args: Sequence[str], *, env: Mapping[str, str], cwd: Path = REPO,
              log: Path, stderr: Path | None = None) -> Forked:
        """`python -m module args` in `cwd`, in a new process group: stdout appended to `log`, and stderr too
        unless `stderr` names another file."""
        request_id = next(self._ids)
        request = {"op": "spawn", "id": request_id, "mode": "module", "argv": [module, *args], "env": dict(env),
                   "cwd": str(cwd), "log": str(log), **({"stderr": str(stderr)} if stderr else {})}
        stdin: IO[bytes] = self._proc.stdin  # type: ignore[assignment]
        with self.changed:
            if self._died:
                raise ForkServerDied(self._died)
            stdin.write((json.dumps(request) + "\n").encode())
            stdin.flush()
            self.changed.wait_for(lambda: request_id in self._spawned or self._died is not None, READY_TIMEOUT_S)
            answer = self._spawned.pop(request_id, None)
            if answer is None:
                raise ForkServerDied(self._died or f"no answer from the zygote in {READY_TIMEOUT_S:.0f} s "
                                                   f"(log: {self.log_path})")
            if isinstance(answer, str):
                raise OSError(f"the zygote could not fork {module}: {answer}")
            forked = Forked(self, answer)
            if answer in self._exits:
                forked.returncode = self._exits.pop(answer)
            else:
                self._running[answer] = forked
            return forked

    def stop(self) -> None:
        """Ends the zygote: it exits when its input ends, and whatever it forked dies with it."""
        with contextlib.suppress(OSError, ValueError):
            self._proc.stdin.close()  # type: ignore[union-attr]
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def run(module: str, *args: str, timeout: float, env: Mapping[str, str] | None = None,
        workdir: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`subprocess.run([python, "-m", module, *args], capture_output=True, text=True)`, forked from the zygote."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = shared().spawn(module, args, env=dict(os.environ if env is None else env), log=out, stderr=err)
        try:
            code = proc.wait(timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        return subprocess.CompletedProcess([module, *args], code, out.read_text(), err.read_text())


_shared: ForkServer | None = None
_lock = threading.Lock()


def shared() -> ForkServer:
    """This process's zygote, started on first use."""
    global _shared
    with _lock:
        if _shared is None or _shared._died:
            log = Path(tempfile.gettempdir()) / f"pdfleet-test-zygote-{time.strftime('%Y%m%d')}.log"
            _shared = ForkServer(log)
            atexit.register(_shared.stop)
        return _shared
