"""One run of a probe against a pod's loopback IP: an HTTP GET or a TCP connect, bounded by the probe's
timeout. A probe that would leave 127.0.0.0/8 is never sent: it fails, saying why."""

from __future__ import annotations

import asyncio
import ipaddress

import aiohttp

from pdfleet.podrunner.probes import Action, http_success


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def run(session: aiohttp.ClientSession, action: Action, pod_ip: str, timeout_s: float) -> tuple[bool, str]:
    host = action.host or pod_ip
    if not _loopback(host):
        return False, f"host {host} is not a loopback address; pdfleet-sim never sends probes off this machine"
    try:
        if action.kind == "tcp":
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, action.port), timeout_s)
            writer.close()
            return True, ""
        url = f"http://{host}:{action.port}{action.path}"
        async with session.get(url, headers=dict(action.headers), allow_redirects=False,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            await r.read()
            if http_success(r.status):
                return True, ""
            return False, f"HTTP probe failed with statuscode: {r.status}"
    except TimeoutError:
        return False, f"Get {action.path}: context deadline exceeded (timeout {timeout_s:g}s)"
    except (aiohttp.ClientError, OSError) as e:
        return False, f"{action.kind} {host}:{action.port}{action.path if action.kind == 'http' else ''}: {e}"
