"""Stacks on demand: a rank blocked in C, even holding the GIL, still shows where it is."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import requires

_BLOCKED_IN_C = """
import ctypes, os, sys
from pdfleet.runtime.health import attach, phases
w = attach.attach_rank(slot=0, rank=0, slots=1, path=sys.argv[1])
libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL, like a C extension that never releases it
r, _ = os.pipe()
buf = ctypes.create_string_buffer(1)

def waiting_in_a_c_call_that_holds_the_gil():
    w.collective(phases.Phase.OTHER_COLLECTIVE)
    libc.read(r, buf, 1)  # never returns: nothing is ever written; restarted after faulthandler's signal

waiting_in_a_c_call_that_holds_the_gil()
"""

_GLOO = """
import os, signal, sys
import torch, torch.distributed as dist
from pdfleet.runtime.health import attach, phases
path, rank, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
marker = sys.argv[4]
signal.signal(signal.SIGUSR1, lambda *_: open(marker, "w").close())
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
w = attach.attach_rank(slot=rank, rank=rank, slots=2, path=path)

def kv_poll_all_reduce():
    w.collective(phases.Phase.KV_POLL_ALL_REDUCE)
    dist.all_reduce(torch.zeros(1))  # rank 1 never joins: rank 0 waits in gloo, in C++

if rank == 0:
    kv_poll_all_reduce()
else:
    w.begin(phases.Phase.IDLE)
    sys.stdin.read()
"""


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    children: list[subprocess.Popen[str]] = []

    def start(script: str, *args: str) -> subprocess.Popen[str]:
        child = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE, text=True)
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()
        child.wait()


def stacks_once(client: httpx.Client) -> dict[str, Any]:
    """One capture, waiting out the agent's rate limit as its Retry-After says."""
    while (response := client.get("/ranks/stacks", params={"timeout": 5})).status_code == 429:
        time.sleep(float(response.headers["Retry-After"]))
    response.raise_for_status()
    return response.json()


def wait_for_stack(
    client: httpx.Client, slot: int, frame: str, child: subprocess.Popen[str], timeout_s: float = 60.0
) -> str:
    """Capture until the rank's stacks show `frame` (the rank may still be on its way into the call)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert child.poll() is None, f"the rank process exited with {child.returncode}"
        entries = {e["slot"]: e for e in stacks_once(client)["ranks"]}
        text = entries.get(slot, {}).get("stacks") or ""
        if frame in text:
            return text
        if time.monotonic() > deadline:
            pytest.fail(f"no {frame!r} in the stacks of slot {slot} within {timeout_s}s: {entries}")
        time.sleep(0.05)


def test_a_rank_blocked_in_c_holding_the_gil_still_dumps_its_stack(served: httpx.Client, spawn, ledger_path) -> None:
    child = spawn(_BLOCKED_IN_C, str(ledger_path))

    text = wait_for_stack(served, 0, "waiting_in_a_c_call_that_holds_the_gil", child)

    assert "most recent call first" in text
    # The interrupted read was restarted: the rank is still there, still blocked where it was.
    again = wait_for_stack(served, 0, "waiting_in_a_c_call_that_holds_the_gil", child)
    assert again.count("waiting_in_a_c_call_that_holds_the_gil") == 1
    assert child.poll() is None


def test_a_rank_that_advertised_no_signal_is_never_signalled(served: httpx.Client, spawn, ledger_path) -> None:
    script = (
        "import sys\n"
        "from pdfleet.runtime.health import attach\n"
        "attach.attach_rank(slot=0, rank=0, slots=1, path=sys.argv[1], stack_signal=None)\n"
        "sys.stdin.read()\n"
    )
    child = spawn(script, str(ledger_path))
    deadline = time.monotonic() + 30
    while not (entries := stacks_once(served)["ranks"]):
        assert time.monotonic() < deadline, "the rank never attached"
        time.sleep(0.01)

    assert entries == [
        {"slot": 0, "rank": 0, "pid": child.pid, "phase": "starting", "error": "no stack signal advertised"}
    ]
    assert child.poll() is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_blocked_in_a_gloo_collective_dumps_its_stack_and_its_python_handlers_never_run(
    served: httpx.Client, spawn, ledger_path: Path, tmp_path: Path
) -> None:
    requires.installed("torch")  # the ranks import it, this process need not
    port, marker = str(_free_port()), tmp_path / "python-handler-ran"
    waiting = spawn(_GLOO, str(ledger_path), "0", port, str(marker))
    spawn(_GLOO, str(ledger_path), "1", port, str(marker))

    text = wait_for_stack(served, 0, "kv_poll_all_reduce", waiting)
    os.kill(waiting.pid, signal.SIGUSR1)
    again = wait_for_stack(served, 0, "kv_poll_all_reduce", waiting)  # a capture later: time for a handler

    assert "all_reduce" in text
    assert "kv_poll_all_reduce" in again
    assert not marker.exists(), "a Python-level handler ran: the rank was not blocked in C after all"
    assert waiting.poll() is None


def test_stack_captures_are_spaced_so_no_caller_can_signal_the_ranks_in_a_loop(served: httpx.Client) -> None:
    first = served.get("/ranks/stacks")
    again = served.get("/ranks/stacks")
    assert first.status_code == 200
    assert again.status_code == 429 and again.headers["Retry-After"] == "1", again.text
    assert "captured less than 1 s ago" in again.json()["error"]
    assert served.get("/ranks").status_code == 200, "the records are served meanwhile"
    time.sleep(float(again.headers["Retry-After"]))  # as the answer says
    assert served.get("/ranks/stacks").status_code == 200
