#!/usr/bin/env python3
"""TCP forwarding between network namespaces: how the real node and the control plane reach each other.

The real node (hack/realnode.py) runs containerd, kubelet and its pods inside a network namespace of its own,
which has no route out of the machine; the control plane listens on the host's loopback. Rather than give the
namespace a link (and so a route) to the host, this process holds sockets in both: it listens in one namespace
and opens each connection in the other, so the only addresses either side ever sends to are loopback ones or
ones inside the node's own namespace.

    netns_proxy.py --forward pdfleet-node:10.0.0.1:443=host:127.0.0.1:16443 \
                   --forward host:127.0.0.1:20250=pdfleet-node:127.0.0.1:20250

Each --forward is LISTEN=CONNECT, each side NETNS:ADDRESS:PORT, where NETNS is a name under /run/netns or `host`
for the namespace this process started in. A socket belongs to the namespace its thread was in when it was
created, so the event loop's only thread switches namespace around each socket() call, never across an await.
Standard library only, like the rest of the local cluster's tools; needs CAP_SYS_ADMIN (root) for setns(2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import os
import signal
import socket
import sys
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
HOST_NS = "host"
_libc = ctypes.CDLL(None, use_errno=True)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    netns: str
    address: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        netns, sep, rest = text.partition(":")
        address, sep2, port = rest.rpartition(":")
        if not (sep and sep2 and netns and address and port.isdigit()):
            raise ValueError(f"{text!r} is not NETNS:ADDRESS:PORT (NETNS `host` for this process's own namespace)")
        return cls(netns, address, int(port))

    def __str__(self) -> str:
        return f"{self.netns}:{self.address}:{self.port}"


def parse_forward(text: str) -> tuple[Endpoint, Endpoint]:
    listen, sep, connect = text.partition("=")
    if not sep:
        raise ValueError(f"{text!r} is not LISTEN=CONNECT")
    return Endpoint.parse(listen), Endpoint.parse(connect)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(netns: str) -> Iterator[None]:
    """This thread inside `netns` for the block (`host`: stay where it is)."""
    if netns == HOST_NS:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


def socket_in(netns: str) -> socket.socket:
    with entered(netns):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    return s


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


def handler(target: Endpoint):
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        upstream = socket_in(target.netns)
        try:
            await loop.sock_connect(upstream, (target.address, target.port))
        except OSError:
            # Refused or unreachable: the client sees its connection closed, as it would without us.
            upstream.close()
            await _close(writer)
            return
        up_reader, up_writer = await asyncio.open_connection(sock=upstream)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        await _close(up_writer)
        await _close(writer)

    return serve


async def serve(forwards: list[tuple[Endpoint, Endpoint]]) -> None:
    servers = []
    for listen, connect in forwards:
        s = socket_in(listen.netns)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((listen.address, listen.port))
        except OSError as e:
            raise SystemExit(f"netns_proxy: cannot listen on {listen}: {e.strerror}") from None
        s.listen(128)
        servers.append(await asyncio.start_server(handler(connect), sock=s))
        print(f"netns_proxy: {listen} -> {connect}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("netns_proxy: ready", file=sys.stderr, flush=True)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--forward", action="append", required=True, metavar="LISTEN=CONNECT")
    args = parser.parse_args(argv)
    try:
        forwards = [parse_forward(f) for f in args.forward]
    except ValueError as e:
        parser.error(str(e))
    asyncio.run(serve(forwards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
