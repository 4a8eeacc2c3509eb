"""The rank-health agent of one engine pod: a small HTTP server over the pod's ledger.

    GET /ranks               the ranks' records as JSON (`report`), read from shared memory
    GET /ranks/stacks        every live rank's Python stacks (`stacks`); ?timeout=<seconds>, default 2; at most
                             one capture a second (429 with Retry-After otherwise)

It only reads the ledger, so it never slows a scheduler rank down; it runs beside the engine (a daemon
thread of the launcher, or `python -m pdfleet.runtime.health.agent`) and must share the ranks' process
namespace to check their pids and signal them. Standard library only.
"""

from __future__ import annotations

import argparse
import http.server
import json
import logging
import os
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from pdfleet.runtime import daemon_http
from pdfleet.runtime.health import ledger, procs, records, report, stacks

log = logging.getLogger(__name__)

PORT_ENV = "PDFLEET_AGENT_PORT"
DEFAULT_PORT = 8470  # the one place the agent port is set; the operator renders pods with it
MAX_STACK_TIMEOUT_S = 30.0
POD_UID_ENV = "PDFLEET_POD_UID"  # the pod's uid, from the downward API: named in every /ranks answer
# A capture signals every rank of the pod, and the agent's port takes no key (the NetworkPolicy is what keeps
# strangers off it): captures are spaced so that no caller can make the ranks dump stacks in a loop. The operator
# asks once per sick group.
STACKS_MIN_INTERVAL_S = 1.0


class Agent(daemon_http.DaemonHTTPServer):
    """Serves one ledger over HTTP from a daemon thread. `start()` binds (port 0: an ephemeral port)."""

    thread_name = "pdfleet-health-agent"

    def __init__(self, ledger_path: str | os.PathLike[str], *, host: str = "0.0.0.0", port: int = DEFAULT_PORT,
                 pod_uid: str | None = None, patches: tuple[str, ...] | None = None,
                 stacks_interval_s: float = STACKS_MIN_INTERVAL_S) -> None:
        super().__init__(host=host, port=port)
        self.ledger_path = Path(ledger_path)
        self.pod_uid = pod_uid or os.environ.get(POD_UID_ENV) or None
        self.patches = patches  # what the launcher applied (None: an agent started on its own, which cannot know)
        self._ledger: ledger.Ledger | None = None
        self._open_lock = threading.Lock()
        self._capture_lock = threading.Lock()  # the rate's bookkeeping
        self._signal_lock = threading.Lock()  # one capture at a time: each rank writes one stack file
        self._stacks_interval_s = stacks_interval_s
        self._last_capture: float | None = None

    @property
    def stacks_interval_s(self) -> float:
        return self._stacks_interval_s

    def stop(self) -> None:
        super().stop()
        if self._ledger is not None:
            self._ledger.close()

    def ranks(self) -> report.PodReport:
        """The pod's ranks now. Before any rank created the ledger, a report with no ranks."""
        led = self._open()
        recs = led.read_all() if led is not None else []
        return report.build(recs, now_ns=time.monotonic_ns(), ledger=str(self.ledger_path), alive=_alive,
                            pod_uid=self.pod_uid, patches=self.patches)

    def capture_wait(self) -> float:
        """0 when a stack capture may start now (and it counts as started), else the seconds until one may."""
        with self._capture_lock:
            now = time.monotonic()
            if self._last_capture is not None and (left := self._last_capture + self._stacks_interval_s - now) > 0:
                return left
            self._last_capture = now
            return 0.0

    def stacks(self, *, timeout_s: float) -> dict[str, Any]:
        """Stacks of every live rank that advertised a stack signal; the others are listed with why not."""
        led = self._open()
        recs = led.read_all() if led is not None else []
        targets: dict[int, stacks.Target] = {}
        entries: list[dict[str, Any]] = []
        for r in recs:
            entry: dict[str, Any] = {"slot": r.slot, "rank": r.rank, "pid": r.pid, "phase": r.phase.label}
            if not _alive(r):
                entry["error"] = "process gone"
            elif r.stack_signal == 0:
                entry["error"] = "no stack signal advertised"
            else:
                targets[r.slot] = stacks.Target(r.pid, r.stack_signal, stacks.stack_path(self.ledger_path, r.slot))
            entries.append(entry)
        with self._signal_lock:
            captured = stacks.capture(list(targets.values()), timeout_s=timeout_s)
        by_target = {c.target: c for c in captured}
        for entry in entries:
            if (target := targets.get(entry["slot"])) is not None:
                c = by_target[target]
                if c.text is not None:
                    entry["stacks"] = c.text
                else:
                    entry["error"] = c.error
        return {"ledger": str(self.ledger_path), "now_ns": time.monotonic_ns(), "ranks": entries}

    def _open(self) -> ledger.Ledger | None:
        with self._open_lock:
            if self._ledger is None:
                try:
                    self._ledger = ledger.Ledger.open_readonly(self.ledger_path)
                except (FileNotFoundError, ledger.LedgerError):
                    return None
            return self._ledger


def _alive(record: records.RankRecord) -> bool:
    return procs.is_alive(record.pid, record.pid_start)


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "pdfleet-health-agent"

    def do_GET(self) -> None:
        agent: Agent = self.server.owner  # type: ignore[attr-defined]
        url = urllib.parse.urlsplit(self.path)
        try:
            if url.path == "/livez":
                # The pod's liveness probe: the engine's main process answers, with its interpreter free.
                # Nothing more: rank health is the operator's judgement from /ranks, never kubelet's.
                self._send(200, {"alive": True})
            elif url.path == "/ranks":
                self._send(200, report.to_json(agent.ranks()))
            elif url.path == "/ranks/stacks":
                query = urllib.parse.parse_qs(url.query)
                timeout_s = min(float(query.get("timeout", ["2"])[0]), MAX_STACK_TIMEOUT_S)
                if (wait := agent.capture_wait()) > 0:
                    self._send(429, {"error": f"stacks were captured less than {agent.stacks_interval_s:g} s ago"},
                               headers={"Retry-After": str(max(1, round(wait)))})
                else:
                    self._send(200, agent.stacks(timeout_s=timeout_s))
            else:
                self._send(404, {"error": f"no such path: {url.path}"})
        except ValueError as e:
            self._send(400, {"error": str(e)})
        except Exception as e:  # the agent must keep answering; say what broke
            log.exception("agent request %s failed", self.path)
            self._send(500, {"error": repr(e)})

    def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


Agent.handler = _Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve this pod's rank-health ledger over HTTP.")
    parser.add_argument("--ledger", default=str(ledger.default_path()))
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=int(os.environ.get(PORT_ENV) or DEFAULT_PORT))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    agent = Agent(args.ledger, host=args.host, port=args.port).start()
    log.info("serving %s on %s:%d", args.ledger, args.host, agent.port)
    threading.Event().wait()


if __name__ == "__main__":
    main()
