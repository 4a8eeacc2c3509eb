"""`python -m pdfleet.runtime.router_ready`: the readiness of a router pod whose router runs circuit breakers.

sglang-router's own `/readiness` (0.3.2) counts workers its health checks call healthy and ignores their circuit
breakers: a router whose every prefill circuit is open answers each request `503 No available prefill workers`
and still says ready, so a Service keeps sending it its share of traffic. This small server, beside the router
in its pod, answers `GET /ready` with 200 only while the router has an available worker of each role: healthy
in `GET /workers` (asked with the control-plane key the router started with) and its circuit not open in the
router's metrics (`smg_worker_cb_state`: 0 closed, 1 open, 2 half-open). Liveness stays the router's own.

Standard library only: it runs on the router's image, with pdfleet's runtime from the pod's runtime volume.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ROLES = ("prefill", "decode")  # sglang-router's worker_type of PD workers
OPEN = 1  # smg_worker_cb_state: 0 closed, 1 open, 2 half-open (a trial request goes through)
KEY_ENV = "PDFLEET_ROUTER_ADMIN_KEY"  # the router container's own variable (operator/render/router_secret.py)
_CB_STATE = re.compile(r'^smg_worker_cb_state\{[^}]*worker="([^"]+)"[^}]*\}\s+([0-9.eE+-]+)\s*$', re.M)


def circuit_states(metrics: str) -> dict[str, int]:
    """Worker URL -> circuit state, from the router's Prometheus text."""
    return {url: int(float(value)) for url, value in _CB_STATE.findall(metrics)}


def available(workers: Iterable[Mapping[str, Any]], states: Mapping[str, int]) -> dict[str, int]:
    """Per role, the workers a request can be sent to: healthy and their circuit not open."""
    counts = dict.fromkeys(ROLES, 0)
    for worker in workers:
        role = str(worker.get("worker_type", ""))
        if role in counts and worker.get("is_healthy") and states.get(str(worker.get("url")), 0) != OPEN:
            counts[role] += 1
    return counts


def verdict(counts: Mapping[str, int]) -> tuple[bool, str]:
    lacking = [role for role in ROLES if counts.get(role, 0) < 1]
    if lacking:
        return False, f"no available {' or '.join(lacking)} worker (healthy, circuit not open): {dict(counts)}"
    return True, f"available workers: {dict(counts)}"


def _get(url: str, key: str | None, timeout: float) -> bytes:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as answer:
        return bytes(answer.read(4 << 20))


def check(router: str, metrics: str, key: str | None, timeout: float = 2.0) -> tuple[bool, str]:
    try:
        listed = json.loads(_get(f"{router}/workers", key, timeout))
        states = circuit_states(_get(f"{metrics}/metrics", None, timeout).decode("utf-8", "replace"))
    except (OSError, ValueError) as e:  # urllib's errors are OSErrors; a body that is no JSON a ValueError
        return False, f"the router does not answer: {e}"
    workers = listed.get("workers") if isinstance(listed, dict) else None
    if not isinstance(workers, list):
        return False, "the router listed no workers"
    return verdict(available((w for w in workers if isinstance(w, dict)), states))


class Verdicts:
    """Says on stderr (the container's log) when the verdict or its reason changes, once: `kubectl logs -c ready`
    tells why a router pod is not Ready without a line per probe."""

    def __init__(self) -> None:
        self._last: tuple[bool, str] | None = None
        self._lock = threading.Lock()

    def said(self, ready: bool, why: str) -> None:
        with self._lock:
            if (ready, why) == self._last:
                return
            self._last = (ready, why)
        print(f"pdfleet-router-ready: {'ready' if ready else 'not ready'}: {why}", file=sys.stderr, flush=True)


def serve(host: str, port: int, router: str, metrics: str, key: str | None) -> None:
    verdicts = Verdicts()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/ready":
                self.send_error(404)
                return
            ready, why = check(router, metrics, key)
            verdicts.said(ready, why)
            body = json.dumps({"ready": ready, "reason": why}).encode()
            self.send_response(200 if ready else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a probe every few seconds is no news; what changes is in the router's own log

    http.server.ThreadingHTTPServer((host, port), Handler).serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pdfleet-router-ready", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, required=True, help="where to answer GET /ready")
    parser.add_argument("--address", required=True, help="the pod's IP, where the router listens")
    parser.add_argument("--router-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True, help="the router's Prometheus port")
    args = parser.parse_args(argv)
    host = f"[{args.address}]" if ":" in args.address else args.address
    try:
        serve(args.host, args.port, f"http://{host}:{args.router_port}", f"http://{host}:{args.metrics_port}",
              os.environ.get(KEY_ENV))
    except OSError as e:
        print(f"pdfleet-router-ready: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
