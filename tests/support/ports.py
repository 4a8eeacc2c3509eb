"""Fixed loopback ports for a test's own control plane, kept out of the kernel's ephemeral range.

A port in that range can be taken at any moment as the local end of an outgoing connection (the shared
cluster's clients open hundreds), so a fixed port there fails now and then with "already in use".
"""

from __future__ import annotations

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
