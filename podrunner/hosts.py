"""The part of cluster DNS pods of the local fleet rely on: a pod's hostname in its headless Service's subdomain.

On a cluster, a pod with `spec.hostname` h and `spec.subdomain` s in namespace n (and a headless Service s) is
`h.s.n.svc` and `h.s.n.svc.cluster.local`, resolving to its IP; a multi-node engine group's followers find node
rank 0 by that name (`--dist-init-addr`). The local fleet has no DNS: the runner, which watches every pod,
keeps those names here and writes each played pod a view of its own namespace's, `<pod dir>/podinfo/hosts`
(/etc/hosts' format, each line's pod uid in a trailing comment, so that a follower can tell which pod of that
name it reached), replaced atomically whenever it changes. The engine simulator reads it
(`runtime/simulator/dns.py`).

As cluster DNS, a name appears once its pod has an IP and goes when the pod is deleted or has finished; of two
live pods with one name, the newer wins. Unlike cluster DNS it does not check that the subdomain's headless
Service exists (the operator always creates it with its pods).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

Body = Mapping[str, Any]
SUFFIXES = ("svc", "svc.cluster.local")
HOSTS_FILE = "hosts"  # in the pod's podinfo directory; runtime/simulator/dns.py reads the same name
HEADER = "# cluster DNS of this namespace's pods, as pdfleet-sim plays it: IP names # uid=<pod uid>"


@dataclasses.dataclass(frozen=True, order=True)
class Entry:
    created: str  # creationTimestamp: of two pods with one name, the newer wins
    uid: str
    ip: str
    names: tuple[str, ...]


def entry(pod: Body) -> Entry | None:
    """The names cluster DNS gives `pod`, with its address; None when it has none (no hostname and subdomain,
    no IP yet, being deleted, finished)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    hostname, subdomain, ip = spec.get("hostname"), spec.get("subdomain"), status.get("podIP")
    if not (hostname and subdomain and ip) or meta.get("deletionTimestamp") or \
            status.get("phase") in ("Failed", "Succeeded"):
        return None
    base = f"{hostname}.{subdomain}.{meta['namespace']}".lower()
    return Entry(str(meta.get("creationTimestamp") or ""), str(meta["uid"]), str(ip),
                 tuple(f"{base}.{suffix}" for suffix in SUFFIXES))


def render(entries: list[Entry]) -> str:
    """The hosts file of one namespace's entries: one line a name, newer pods winning, sorted by name."""
    by_name: dict[str, Entry] = {}
    for e in sorted(entries):
        by_name[e.names[0]] = e
    lines = [HEADER, *(f"{e.ip} {' '.join(e.names)} # uid={e.uid}" for _, e in sorted(by_name.items()))]
    return "\n".join(lines) + "\n"


class HostsView:
    """Every pod's names, by namespace; `note` and `forget` say which namespace's view changed."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Entry]] = {}  # namespace -> uid -> entry
        self._text: dict[str, str] = {}

    def note(self, pod: Body) -> bool:
        """Takes in the latest version of `pod`; True when its namespace's view changed."""
        namespace, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        found = entry(pod)
        pods = self._entries.get(namespace, {})
        if pods.get(uid) == found:
            return False
        if found is None:
            pods.pop(uid, None)
        else:
            self._entries.setdefault(namespace, pods)[uid] = found
        return self._rerender(namespace)

    def forget(self, pod: Body) -> bool:
        """`pod` was deleted; True when its namespace's view changed."""
        namespace = pod["metadata"]["namespace"]
        if self._entries.get(namespace, {}).pop(pod["metadata"]["uid"], None) is None:
            return False
        return self._rerender(namespace)

    def text(self, namespace: str) -> str:
        return self._text.get(namespace) or render([])

    def _rerender(self, namespace: str) -> bool:
        text = render(list(self._entries.get(namespace, {}).values()))
        if self._text.get(namespace) == text:
            return False
        self._text[namespace] = text
        if not self._entries.get(namespace):
            self._entries.pop(namespace, None)
        return True
