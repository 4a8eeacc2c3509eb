"""Fixed loopback ports for a test's own control plane, kept out of the kernel's ephemeral range.

A port in that range can be taken at any moment as the local end of an outgoing connection (the shared
cluster's clients open hundreds), so a fixed port there fails now and then with "already in use".
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range() -> range:
    low, high = (int(n) for n in RANGE_FILE.read_text().split())
    return range(low, high + 1)


def outside_ephemeral(ports: dict[str, str]) -> dict[str, str]:
    """`ports` unchanged, once none of them can be handed out as an ephemeral port on this machine."""
    ephemeral = ephemeral_range()
    inside = {name: port for name, port in ports.items() if int(port) in ephemeral}
    assert not inside, (f"{inside} lie in this machine's ephemeral port range {ephemeral.start}-{ephemeral.stop - 1} "
                        f"({RANGE_FILE}): pick ports below it")
    return ports


# Where `free_port` looks: below the ephemeral range of the usual kernels (32768-60999), above the fixed ports of
# the local cluster, its real node and the private clusters (16443, 20247-20260, 23790-26443).
FREE_PORTS = range(27000, 32768)


def worker_slice(ports: range | list[int], env: dict[str, str] | None = None) -> list[int]:
    """This pytest-xdist worker's share of `ports`: workers get disjoint shares, so two of them never hand out the
    same port (a random pick from one common pool did, now and then: one engine's agent found its port taken)."""
    env = os.environ if env is None else env
    count = int(env.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    worker = env.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return [p for i, p in enumerate(ports) if i % count == index % count]


_handed_out: list[int] = []


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing listens on now and that the kernel never hands out as the local end of an
    outgoing connection: a port the kernel picks (bind to 0) is an ephemeral one, which another process's
    connection can take between this check and the server's bind (a clean-clone make test once lost an
    operator's health port that way).

    Ports come from this worker's own share of FREE_PORTS, in a shuffled order walked round once before any port
    comes again: callers often ask for several ports before binding any (an engine's HTTP, agent and bootstrap
    ports), and a fresh random pick could return the same one twice. The kernel's own pick where this machine's
    ephemeral range covers FREE_PORTS."""
    if not _handed_out:
        ephemeral = ephemeral_range()
        share = worker_slice([p for p in FREE_PORTS if p not in ephemeral])
        random.shuffle(share)
        _handed_out.extend(share)
    for _ in range(min(len(_handed_out), 200)):
        port = _handed_out.pop(0)
        _handed_out.append(port)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
