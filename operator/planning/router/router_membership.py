"""Which engines a pool's routers should send requests to, and what to change so that they do. Pure.

sglang-router (0.3.2) finds engines by pod labels, but its discovery only ever adds: a pod that turns NotReady
stays in rotation, a pod deleted while NotReady stays registered for good (its IP, reused by a new pod, then
fails to register), and it never resyncs. So the operator keeps each router's worker list equal to what it
knows, through the router's own worker API, every heartbeat:

- in rotation: the node-rank-0 pod of every group whose pods are all Ready (none terminating) and whose rank
  health is not sick (a group in Desync, Hang, Dead or Unreachable leaves rotation at once, before its
  evidence is captured and it is restarted: requests stop queueing on an engine that will never answer them);
- a registered worker of a sick group, or of a group being deleted (drained by a rollout, a restart, a scale
  down: its preStop hook then waits for what it has in flight), is removed at once;
- any other registered worker that is not in rotation (NotReady, a stale registration of a
  deleted pod) is removed once it has been so for `grace` seconds: the router sees pods through a watch of
  its own, and a pod it has just seen turn Ready may not be Ready in the operator's view yet;
- a worker in rotation that the router lacks is added after the same grace: discovery adds a newly Ready
  pod by itself within a second or so, and two registrations of one URL would race.

Discovery never re-adds a worker that was removed through the API (it remembers pods it has seen), which is
why the operator also adds back a group that becomes healthy again.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from pdfleet.operator.api.roles import PrefillSpec, Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import Verdict
from pdfleet.operator.planning.groups import leader_pod, pod_ready, pods_by_group
from pdfleet.operator.render import labels

Body = dict[str, Any]
SICK = frozenset({Verdict.DESYNC, Verdict.HANG, Verdict.DEAD, Verdict.UNREACHABLE})
TERMINATING = "terminating"  # a pod being deleted never comes back: no view can lag behind that


@dataclasses.dataclass(frozen=True)
class Worker:
    """An engine as a router registers it: `POST /workers` takes exactly these."""

    url: str
    role: Role
    bootstrap_port: int | None
    group: str


@dataclasses.dataclass(frozen=True)
class Registered:
    """One entry of a router's `GET /workers`."""

    id: str
    url: str
    worker_type: str
    healthy: bool = True  # the router's own health checks


@dataclasses.dataclass(frozen=True)
class Removal:
    worker: Registered
    reason: str


@dataclasses.dataclass(frozen=True)
class Changes:
    remove: tuple[Removal, ...] = ()
    add: tuple[Worker, ...] = ()
    # URLs in rotation that the router lacks, and registered URLs out of rotation for a reason that may be a
    # view lagging behind, each with the time it was first seen so (carry both to the next call)
    missing_since: Mapping[str, float] = dataclasses.field(default_factory=dict)
    unwanted_since: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.remove or self.add)


def worker_url(ip: str, port: int) -> str:
    return f"http://[{ip}]:{port}" if ":" in ip else f"http://{ip}:{port}"


def pod_ip(pod: Body) -> str | None:
    """The pod's IP from its status, only if it is an address (never a name to resolve)."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    try:
        ipaddress.ip_address(ip)
    except ValueError:  # never let a status field become a host name to resolve
        return None
    return str(ip)


def in_rotation(spec: InferencePoolSpec, pods: Sequence[Body],
                verdicts: Mapping[str, Verdict]) -> tuple[dict[str, Worker], dict[str, str]]:
    """The workers the pool's routers should have, by URL, and why each other engine pod is left out (by URL,
    for pods that have an address)."""
    wanted: dict[str, Worker] = {}
    left_out: dict[str, str] = {}
    for group, members in pods_by_group(pods).items():
        role_value = (members[0]["metadata"].get("labels") or {}).get(labels.ROLE)
        try:
            role = Role(role_value)
        except ValueError:
            continue
        role_spec = spec.role(role)
        leader = leader_pod(members)
        ip = pod_ip(leader) if leader is not None else None
        if ip is None:
            continue
        url = worker_url(ip, role_spec.port)
        verdict = verdicts.get(group, Verdict.UNKNOWN)
        live = [p for p in members if not p["metadata"].get("deletionTimestamp")]
        if len(live) < len(members):
            left_out[url] = TERMINATING
        elif len(live) != role_spec.nodes_per_group or not all(pod_ready(p) for p in live):
            left_out[url] = "not Ready"
        elif verdict in SICK:
            left_out[url] = str(verdict)
        else:
            port = role_spec.bootstrap_port if isinstance(role_spec, PrefillSpec) else None
            wanted[url] = Worker(url=url, role=role, bootstrap_port=port, group=group)
    return wanted, left_out


def plan(wanted: Mapping[str, Worker], registered: Sequence[Registered], left_out: Mapping[str, str], *,
         missing_since: Mapping[str, float], now: float, grace: float,
         unwanted_since: Mapping[str, float] | None = None) -> Changes:
    """What to change on one router. `missing_since` and `unwanted_since` are what the previous call returned
    for this router."""
    remove: list[Removal] = []
    present: set[str] = set()
    unwanted: dict[str, float] = {}
    sick = {str(v) for v in SICK}
    for entry in registered:
        worker = wanted.get(entry.url)
        if worker is None:
            reason = left_out.get(entry.url, "no such engine in the pool")
            if reason not in sick and reason != TERMINATING:
                unwanted[entry.url] = since = (unwanted_since or {}).get(entry.url, now)
                if now - since < grace:
                    continue
            remove.append(Removal(entry, reason))
        elif entry.worker_type != str(worker.role):
            remove.append(Removal(entry, f"registered as {entry.worker_type}, is {worker.role}"))
        else:
            present.add(entry.url)
    since = {url: missing_since.get(url, now) for url in wanted if url not in present}
    add = tuple(wanted[url] for url, t in sorted(since.items()) if now - t >= grace)
    return Changes(remove=tuple(remove), add=add, missing_since=since, unwanted_since=unwanted)
