"""Fixed loopback ports for a test's own control plane, kept out of the kernel's ephemeral range.

A port in that range can be taken at any moment as the local end of an outgoing connection (the shared
cluster's clients open hundreds), so a fixed port there fails now and then with "already in use".
"""

from __future__ import annotations

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


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing listens on now and that the kernel never hands out as the local end of an
    outgoing connection: a port the kernel picks (bind to 0) is an ephemeral one, which another process's
    connection can take between this check and the server's bind (a clean-clone make test once lost an
    operator's health port that way). Random in FREE_PORTS, so that workers seldom try the same one; the
    kernel's own pick where this machine's ephemeral range covers FREE_PORTS."""
    ephemeral = ephemeral_range()
    candidates = [p for p in FREE_PORTS if p not in ephemeral]
    for port in random.sample(candidates, min(len(candidates), 200)):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
