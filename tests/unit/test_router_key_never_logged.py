"""The router's control-plane key never reaches a log: a router that answers garbage, or echoes the request, to the
operator's worker calls (GET, POST and DELETE /workers) makes the operator log that the call failed, and what it
logs names neither the key nor the request's headers. (aiohttp's ClientResponseError repr holds those headers: the
operator once logged it with %r, the key in the bearer header with it.)"""

from __future__ import annotations

import asyncio
import logging

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.planning.router.router_membership import Registered, Worker

KEY = "pdfleet-router-key-0123456789abcdef"
ROUTER = {"metadata": {"name": "router-0"}}

REPLIES = {
    "bad status line": b"garbage\r\n\r\n",
    "bad status code": b"HTTP/1.1 abc\r\n\r\n",
    "truncated chunks": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "headers echoed in a 400": None,  # the request as received, sent back as the body of a 400
}


async def _router(reply: bytes | None) -> tuple[asyncio.Server, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.read(65536)
        body = request if reply is None else b""
        writer.write(reply if reply is not None else
                     b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


@pytest.mark.parametrize("reply", REPLIES.values(), ids=REPLIES.keys())
async def test_a_garbage_answer_is_logged_as_a_failure_without_the_key(
        reply: bytes | None, logs: pytest.LogCaptureFixture) -> None:
    server, port = await _router(reply)
    client = EngineClient(addressing=lambda pod, p: ("127.0.0.1", port))
    try:
        worker = Registered(id="w1", url="http://127.0.0.1:9/", worker_type="decode", healthy=True)
        assert await client.remove_worker(ROUTER, port, KEY, worker) is False
        assert await client.add_worker(ROUTER, port, KEY, Worker(url="http://127.0.0.1:9", role=Role.DECODE,
                                                                  bootstrap_port=None, group="g")) is False
        assert await client.workers(ROUTER, port, KEY) is None
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
    warnings = [r.getMessage() for r in logs.records if r.levelno >= logging.WARNING]
    assert any(m.startswith("DELETE ") for m in warnings) and any(m.startswith("POST ") for m in warnings), \
        "a failed write is reported at warning"
    for record in logs.records:
        text = record.getMessage() + (logs.text if record.exc_info else "")
        assert KEY not in text and "CIMultiDictProxy" not in text, text  # neither the key nor a headers dump
