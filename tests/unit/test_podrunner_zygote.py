"""A container ends as a pid namespace does: its exit is reported only once every process of its group is
gone. Before, the exit of the first process was reported at once, and a container started again at once (a
restart, or the next pod on the same loopback IP) found its ports still bound ("Address already in use")."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from pdfleet.podrunner import zygote
from tests.support.ports import free_port

SERVE = ("from pdfleet.podrunner import zygote; zygote._prctl(zygote.PR_SET_CHILD_SUBREAPER, 1); "
         "zygote.Zygote().serve()")  # the zygote without its SGLang imports, which this test does not need


def read_message(proc: subprocess.Popen[bytes], timeout: float = 90) -> dict[str, Any]:
    """The zygote's next message. Its stdout must be unbuffered (`bufsize=0`): a buffered reader's readline reads
    ahead, and a second message already in its buffer is invisible to select (it once waited out the 90 s)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no message from the zygote within {timeout} s"
    return json.loads(proc.stdout.readline())


def send(zygote: subprocess.Popen[bytes], request: dict[str, Any]) -> None:
    assert zygote.stdin is not None
    zygote.stdin.write((json.dumps(request) + "\n").encode())
    zygote.stdin.flush()


def test_an_exit_is_reported_only_once_the_containers_other_processes_are_gone(tmp_path: Path) -> None:
    port = free_port()
    # The container's first process starts a listener in the background (an engine's rank-health agent, say)
    # and exits with 3; the listener would live on if nothing killed it.
    listener = (f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
                f"open('{tmp_path}/listening', 'w').write(str(__import__('os').getpid())); time.sleep(600)")
    script = (f"{sys.executable} -c \"{listener}\" & "
              f"while [ ! -s {tmp_path}/listening ]; do sleep 0.05; done; exit 3")
    zygote = subprocess.Popen([sys.executable, "-c", SERVE], bufsize=0, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        request = {"op": "spawn", "id": 1, "mode": "exec", "argv": ["sh", "-c", script], "env": dict(os.environ),
                   "cwd": str(tmp_path), "log": str(tmp_path / "log")}
        send(zygote, request)
        spawned = read_message(zygote)
        assert spawned["op"] == "spawned", spawned
        ended = read_message(zygote)
        listener_pid = int((tmp_path / "listening").read_text())

        assert ended == {"op": "exit", "pid": spawned["pid"], "code": 3, "signal": None}
        try:
            os.kill(listener_pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        assert not alive, "the container's exit was reported while one of its processes still ran"
        with socket.socket() as s:  # what a container started again at once does first
            s.bind(("127.0.0.1", port))
    finally:
        zygote.kill()
        zygote.wait()


def test_a_container_whose_processes_all_end_is_reported_at_once(tmp_path: Path) -> None:
    zygote = subprocess.Popen([sys.executable, "-c", SERVE], bufsize=0, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        request = {"op": "spawn", "id": 7, "mode": "exec", "argv": ["sh", "-c", "exit 0"], "env": dict(os.environ),
                   "cwd": str(tmp_path), "log": str(tmp_path / "log")}
        send(zygote, request)
        spawned = read_message(zygote)
        assert read_message(zygote) == {"op": "exit", "pid": spawned["pid"], "code": 0, "signal": None}
    finally:
        zygote.kill()
        _, err = zygote.communicate()
    assert b"outlived" not in err  # reported because the group was gone, not because its deadline passed


def test_a_module_runs_as_python_dash_m_would_run_it(tmp_path: Path) -> None:
    """The desync reproductions start this way (tests/support/forkserver.py): `__main__`, its argv, its own
    directory importable, its exit status."""
    (tmp_path / "probe_helper.py").write_text("VALUE = 'imported from the cwd'\n")
    (tmp_path / "probe.py").write_text(
        "import json, sys\nimport probe_helper\n"
        "if __name__ == '__main__':\n"
        "    print(json.dumps({'argv': sys.argv[1:], 'helper': probe_helper.VALUE}), flush=True)\n"
        "    print('to stderr', file=sys.stderr, flush=True)\n"
        "    sys.exit(int(sys.argv[1]))\n")
    zygote = subprocess.Popen([sys.executable, "-c", SERVE], bufsize=0, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        request = {"op": "spawn", "id": 3, "mode": "module", "argv": ["probe", "5", "x y"], "env": dict(os.environ),
                   "cwd": str(tmp_path), "log": str(tmp_path / "log"), "stderr": str(tmp_path / "err")}
        send(zygote, request)
        spawned = read_message(zygote)
        assert read_message(zygote) == {"op": "exit", "pid": spawned["pid"], "code": 5, "signal": None}
    finally:
        zygote.kill()
        zygote.wait()
    printed = json.loads((tmp_path / "log").read_text().splitlines()[-1])
    assert printed == {"argv": ["5", "x y"], "helper": "imported from the cwd"}
    assert (tmp_path / "err").read_text() == "to stderr\n", "standard error apart, when asked"


def test_a_container_signalled_before_it_is_its_own_process_group_is_signalled_all_the_same() -> None:
    """Between the zygote's fork and the child's setsid, the container has no process group of its own: a signal
    then (a pod deleted the moment it starts) reaches the child itself, and the group is not forgotten, so the
    SIGKILL that ends the grace period still lands."""
    # A process in this test's own group, as a forked child is until its setsid.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert os.getpgid(child.pid) != child.pid
        z = zygote.Zygote()
        z.children.add(child.pid)
        z.groups.add(child.pid)
        z.signal(child.pid, signal.SIGTERM)
        assert child.wait(timeout=30) == -signal.SIGTERM
        assert child.pid in z.groups, "kept: the group's SIGKILL must still find it"
    finally:
        child.kill()
        child.wait()
