"""Names to addresses, as a pod on the local fleet sees cluster DNS: the pod runner's hosts view.

`--dist-init-addr` names the group's node rank 0 as `<pod hostname>.<service>.<namespace>.svc:<port>`, which
cluster DNS resolves (a headless Service and the pod's hostname and subdomain) to the pod's IP. The local
fleet has no DNS: the pod runner writes what it would answer into `$PDFLEET_PODINFO/hosts`, in /etc/hosts'
format, one pod a line, the pod's uid in a trailing comment, rewritten atomically when a pod of the namespace
gets or loses its address:

    127.1.0.7 fleet-decode-0-0.fleet-decode.ns.svc fleet-decode-0-0.fleet-decode.ns.svc.cluster.local # uid=4f…

A name that is not there yet does not resolve (a pod not created or without an IP: a lookup fails the same on a
cluster); an IP literal is itself. Only loopback addresses ever come back: on the local fleet every pod IP is
one, and nothing here may reach anything else.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from collections.abc import Mapping
from pathlib import Path

HOSTS_FILE = "hosts"
UID_TAG = "uid="
PODINFO_ENV = "PDFLEET_PODINFO"
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


@dataclasses.dataclass(frozen=True)
class Address:
    ip: str
    pod_uid: str | None = None  # the pod the name belongs to, when the view says


def parse_hosts(text: str) -> dict[str, Address]:
    """name -> address, from hosts lines (`IP name... # uid=<uid>`); comment lines and malformed ones are
    skipped."""
    out: dict[str, Address] = {}
    for line in text.splitlines():
        body, _, comment = line.partition("#")
        fields = body.split()
        if len(fields) < 2:
            continue
        tag = comment.strip()
        uid = (tag[len(UID_TAG):].strip() or None) if tag.startswith(UID_TAG) else None
        for name in fields[1:]:
            out[name.lower().rstrip(".")] = Address(fields[0], uid)
    return out


def loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip) in LOOPBACK
    except ValueError:
        return False


def hosts_path(env: Mapping[str, str]) -> Path | None:
    """The pod's hosts view, when the runner gives it one (`$PDFLEET_PODINFO`)."""
    podinfo = env.get(PODINFO_ENV)
    return Path(podinfo) / HOSTS_FILE if podinfo else None


def resolve(name: str, hosts: Path | None) -> Address | None:
    """`name`'s loopback address, from the hosts view at `hosts` when there is one, else from the system's
    resolver for an IP literal or, without a view, any name. None while it does not resolve (yet) to a loopback
    address."""
    literal = _literal(name)
    if literal is not None:
        return Address(literal) if loopback(literal) else None
    if hosts is not None:
        try:
            found = parse_hosts(hosts.read_text()).get(name.lower().rstrip("."))
        except OSError:
            found = None
        return found if found is not None and loopback(found.ip) else None
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    ips = [str(info[4][0]) for info in infos]
    return next((Address(ip) for ip in ips if loopback(ip)), None)


def _literal(name: str) -> str | None:
    try:
        return str(ipaddress.ip_address(name.strip("[]")))
    except ValueError:
        return None
