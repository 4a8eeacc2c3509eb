"""The PD "KV transfer": the prefill engine publishes each room's KV on its bootstrap port, the decode engine
fetches it from there.

What travels is what the decode side needs to continue: the prompt's token ids and the first output token.
The prefill side keeps a room until the decode side took it (then its own answer to the router completes,
as SGLang's prefill finishes a request only once its KV was sent) or until `kv_wait_s` passed (then both
sides fail the request). Either side may come first: the router sends to both at once.

Bootstrap server, on `--disaggregation-bootstrap-port` at the bind address:
    GET /health                         "OK", as SGLang's bootstrap server
    GET /route                          this prefill's parallel layout
    GET /sim/kv/{room}?wait=<seconds>   the room's KV as JSON once published; 404 after `wait`
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import aiohttp
from aiohttp import web

from pdfleet.runtime.simulator.config import Engine

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's health probe in PD mode: no transfer happens for it


class TransferFailed(Exception):
    pass


@dataclasses.dataclass
class _Room:
    created: float
    published: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    fetched: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    payload: dict[str, Any] = dataclasses.field(default_factory=dict)


class Rooms:
    """The prefill side's published rooms."""

    def __init__(self, ttl_s: float) -> None:
        self._rooms: dict[int, _Room] = {}
        self._ttl_s = ttl_s

    def _room(self, room: int) -> _Room:
        self._expire()
        if room not in self._rooms:
            self._rooms[room] = _Room(time.monotonic())
        return self._rooms[room]

    def _expire(self) -> None:
        old = time.monotonic() - 2 * self._ttl_s
        for key in [k for k, r in self._rooms.items() if r.created < old]:
            del self._rooms[key]

    async def publish_and_wait(self, room: int, payload: dict[str, Any], timeout_s: float) -> bool:
        """Publish; True once the decode side took it, False if it did not within `timeout_s`."""
        r = self._room(room)
        r.payload = payload
        r.published.set()
        try:
            await asyncio.wait_for(r.fetched.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self._rooms.pop(room, None)

    async def take(self, room: int, timeout_s: float) -> dict[str, Any] | None:
        r = self._room(room)
        try:
            await asyncio.wait_for(r.published.wait(), timeout_s)
        except TimeoutError:
            return None
        r.fetched.set()
        return r.payload


def bootstrap_app(engine: Engine, rooms: Rooms, max_wait_s: float) -> web.Application:
    async def health(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def route(request: web.Request) -> web.Response:
        return web.json_response({"attn_tp_size": engine.tp_size, "attn_cp_size": 1, "dp_size": 1,
                                  "pp_size": engine.pp_size, "page_size": 1, "kv_cache_dtype": "auto",
                                  "follow_bootstrap_room": True})

    async def kv(request: web.Request) -> web.Response:
        try:
            room = int(request.match_info["room"])
            wait = min(float(request.query.get("wait", "0")), max_wait_s)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        payload = await rooms.take(room, wait)
        if payload is None:
            return web.json_response({"error": f"bootstrap_room {room} not published"}, status=404)
        return web.json_response(payload)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_route("*", "/route", route)
    app.router.add_get("/sim/kv/{room}", kv)
    return app


async def fetch(session: aiohttp.ClientSession, host: str, port: int, room: int, wait_s: float) -> dict[str, Any]:
    """The decode side: the room's KV from the prefill's bootstrap server. Raises TransferFailed."""
    host_part = f"[{host}]" if ":" in host else host
    url = f"http://{host_part}:{port}/sim/kv/{room}"
    try:
        timeout = aiohttp.ClientTimeout(total=wait_s + 5, connect=min(5.0, wait_s + 1))
        async with session.get(url, params={"wait": str(wait_s)}, timeout=timeout) as response:
            if response.status != 200:
                raise TransferFailed(f"bootstrap server {host}:{port} answered {response.status}: "
                                     f"{(await response.text())[:200]}")
            return dict(await response.json())
    except (aiohttp.ClientError, TimeoutError) as e:
        raise TransferFailed(f"cannot reach the prefill's bootstrap server {host}:{port}: {e!r}") from None
