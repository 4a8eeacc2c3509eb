"""The wire between the pods of a multi-node group: the leader's rendezvous server and each rank's link to it.

Node rank 0's engine process serves the group's `Meeting` (`meeting.py`) on the port of `--dist-init-addr`,
bound on its pod IP, as torch.distributed's TCPStore is; every rank process of every pod of the group, the
leader's own included, holds one connection to it. Followers find the leader at the host of `--dist-init-addr`
through the pod's view of cluster DNS (`dns.py`), retrying while the name does not resolve or the leader
refuses them. JSON lines, one request and one answer at a time:

    rank -> leader   {"hello": {group, nnodes, world, node_rank, rank, leader_uid}}
    leader -> rank   {"ok": true} once every rank of the group joined, or {"ok": false, "why": ...} and close
    rank -> leader   {"arrive": seq, "kind": "recv_broadcast"}   this pod's ranks all entered collective `seq`
    leader -> rank   {"go": seq}                                  ... and every pod's did, the same one

A rank blocked on the wire still sees a stop (`stopped()`, polled every `POLL_S`): it then raises
`threading.BrokenBarrierError`, as a barrier broken by `RankGroup.stop` does. A leader gone (its pod killed)
leaves the link's ranks blocked where they are until they are stopped, as NCCL leaves the survivors of a dead
peer: the operator then sees the dead pod as Dead or Unreachable and the others as Hang or Desync.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pdfleet.runtime.simulator import dns
from pdfleet.runtime.simulator.meeting import Hello, Meeting

log = logging.getLogger(__name__)

GROUP_ENV = "PDFLEET_GROUP"
POD_UID_ENV = "PDFLEET_POD_UID"
POLL_S = 0.1  # how soon a rank blocked on the wire sees a stop
RETRY_S = 0.2  # between two tries to reach the leader (a name not resolving yet, a refusal, a closed port)
CONNECT_TIMEOUT_S = 2.0
QUIET_S = 2.0  # a leader not reachable for this long is worth a line in the log (at start it is, for a moment)


def split_addr(addr: str) -> tuple[str, int]:
    """`host:port` (`[v6]:port`) -> (host, port). Raises ValueError."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--dist-init-addr {addr!r} is not host:port")
    return host.strip("[]"), int(port)


@dataclasses.dataclass(frozen=True)
class Crossing:
    """How one pod's ranks reach the rest of their multi-node group."""

    group: str
    nnodes: int
    world: int
    node_rank: int
    leader_host: str  # followers: the host of --dist-init-addr; the leader: the loopback address it listens on
    port: int
    hosts: Path | None  # the pod's hosts view (None: the system's resolver)
    own_uid: str | None  # this pod's uid, when the pod says (the downward API's metadata.uid)

    @classmethod
    def of(cls, *, nnodes: int, node_rank: int, world: int, dist_init_addr: str | None, bind: str,
           env: Mapping[str, str]) -> Crossing | None:
        """The crossing of a multi-node engine; None for one that fits one pod, whose ranks meet only locally.
        Raises ValueError for a malformed --dist-init-addr."""
        if nnodes < 2 or not dist_init_addr:
            return None
        host, port = split_addr(dist_init_addr)
        if node_rank == 0:
            host = bind if dns.loopback(bind) else "127.0.0.1"  # never listen beyond loopback
        return cls(group=env.get(GROUP_ENV) or dist_init_addr, nnodes=nnodes, world=world, node_rank=node_rank,
                   leader_host=host, port=port, hosts=dns.hosts_path(env), own_uid=env.get(POD_UID_ENV) or None)

    @property
    def leader(self) -> bool:
        return self.node_rank == 0


# ------------------------------------------------------------------------------------------------- wire


class _Closed(Exception):
    """The other end went away."""


class _Stopped(Exception):
    """The rank was asked to stop while it waited on the wire."""


class _Lines:
    """JSON lines over a socket, read with a short timeout so that a waiting rank notices a stop."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = b""
        sock.settimeout(POLL_S)

    def send(self, obj: Mapping[str, Any]) -> None:
        try:
            self.sock.sendall(json.dumps(obj).encode() + b"\n")
        except OSError as e:
            raise _Closed(str(e)) from None

    def recv(self, stopped: Callable[[], bool]) -> dict[str, Any]:
        while b"\n" not in self._buf:
            if stopped():
                raise _Stopped
            try:
                chunk = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError as e:
                raise _Closed(str(e)) from None
            if not chunk:
                raise _Closed("connection closed")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return dict(json.loads(line))
        except ValueError as e:
            raise _Closed(f"garbled: {e}") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


# ----------------------------------------------------------------------------------------------- leader


class Server:
    """The leader's rendezvous: one thread per rank connection, all around one `Meeting` and its lock."""

    def __init__(self, crossing: Crossing) -> None:
        self.crossing = crossing
        self.meeting = Meeting(group=crossing.group, nnodes=crossing.nnodes, world=crossing.world,
                               leader_uid=crossing.own_uid)
        self.cond = threading.Condition()
        self.closing = False
        self._tcp: socketserver.ThreadingTCPServer | None = None
        self._refusals_said: set[tuple[int, str]] = set()  # a follower retries every RETRY_S: say each once

    def start(self) -> Server:
        """Listen (raises OSError when the address is taken) and serve from a daemon thread."""
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner.serve_one(self.request)

        class TCP(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._tcp = TCP((self.crossing.leader_host, self.crossing.port), Handler)
        threading.Thread(target=self._tcp.serve_forever, name="pdfleet-sim-rendezvous", daemon=True).start()
        return self

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        if self._tcp is not None:
            self._tcp.shutdown()
            self._tcp.server_close()

    def _wait(self, done: Callable[[], bool]) -> bool:
        """Under the lock: wait until `done()`; False when the server closes first."""
        self.cond.wait_for(lambda: done() or self.closing)
        return not self.closing

    def serve_one(self, sock: socket.socket) -> None:
        lines = _Lines(sock)
        never: Callable[[], bool] = lambda: self.closing  # noqa: E731
        try:
            hello = Hello.from_json(lines.recv(never).get("hello") or {})
            with self.cond:
                why = self.meeting.join(hello)
                self.cond.notify_all()
                formed = why is None and self._wait(lambda: self.meeting.formed)
            if why is not None and (hello.rank, why) not in self._refusals_said:
                self._refusals_said.add((hello.rank, why))
                log.warning("simulator: rendezvous refused rank %s of node %s: %s", hello.rank, hello.node_rank, why)
            if why is not None:
                lines.send({"ok": False, "why": why})
                return
            if not formed:
                return
            lines.send({"ok": True})
            while True:
                asked = lines.recv(never)
                seq, kind = int(asked["arrive"]), str(asked["kind"])
                with self.cond:
                    self.meeting.arrive(hello.node_rank, seq, kind)
                    self.cond.notify_all()
                    if not self._wait(lambda seq=seq: self.meeting.released(seq)):
                        return
                lines.send({"go": seq})
        except (_Closed, _Stopped, ValueError, KeyError, TypeError):
            pass  # a rank gone (its pod ended) leaves the meeting as it is: the others stay blocked
        finally:
            lines.close()


# ------------------------------------------------------------------------------------------------- rank


class Link:
    """One rank process's connection to its group's leader."""

    def __init__(self, crossing: Crossing, *, rank: int, stopped: Callable[[], bool]) -> None:
        self.crossing = crossing
        self.rank = rank
        self.stopped = stopped
        self._lines: _Lines | None = None
        self._said = ""
        self._since = time.monotonic()

    def _say_once(self, message: str) -> None:
        if message != self._said and time.monotonic() - self._since >= QUIET_S:
            log.warning("simulator: rank %s: %s", self.rank, message)
            self._said = message

    def _leader(self) -> dns.Address | None:
        if self.crossing.leader:
            return dns.Address(self.crossing.leader_host, self.crossing.own_uid)
        return dns.resolve(self.crossing.leader_host, self.crossing.hosts)

    def join(self) -> bool:
        """Reach the leader and join the group; returns once the whole group has joined (True), or when stopped
        first (False)."""
        c = self.crossing
        while not self.stopped():
            leader = self._leader()
            if leader is None:
                self._say_once(f"waiting for {c.leader_host} to resolve to a loopback address")
                time.sleep(RETRY_S)
                continue
            hello = Hello(c.group, c.nnodes, c.world, c.node_rank, self.rank, leader.pod_uid)
            try:
                sock = socket.create_connection((leader.ip, c.port), timeout=CONNECT_TIMEOUT_S)
            except OSError as e:
                self._say_once(f"cannot reach the leader at {leader.ip}:{c.port} yet: {e}")
                time.sleep(RETRY_S)
                continue
            lines = _Lines(sock)
            try:
                lines.send({"hello": hello.to_json()})
                answer = lines.recv(self.stopped)
            except _Stopped:
                lines.close()
                return False
            except _Closed as e:
                lines.close()
                self._say_once(f"the leader at {leader.ip}:{c.port} went away while joining: {e}")
                time.sleep(RETRY_S)
                continue
            if answer.get("ok") is True:
                self._lines = lines
                return True
            lines.close()
            self._say_once(f"refused by {leader.ip}:{c.port}: {answer.get('why')}")
            time.sleep(RETRY_S)
        return False

    def meet(self, seq: int, kind: str) -> None:
        """Block until every pod of the group has entered collective `seq`, a `kind`. Raises
        threading.BrokenBarrierError when the rank is stopped meanwhile."""
        try:
            if self._lines is None:
                raise _Closed("never joined")
            self._lines.send({"arrive": seq, "kind": kind})
            while int(self._lines.recv(self.stopped).get("go", -1)) != seq:
                pass
            return
        except _Stopped:
            raise threading.BrokenBarrierError from None
        except (_Closed, ValueError, TypeError) as e:
            # A peer gone never comes back within this group: stay in the collective, as NCCL's survivors do.
            self._say_once(f"lost the group's leader in collective {seq} ({kind}): {e}; blocked until stopped")
        while not self.stopped():
            time.sleep(POLL_S)
        raise threading.BrokenBarrierError
