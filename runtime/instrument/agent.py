"""The rank-health agent as an engine pod runs it: `health.agent.Agent`, plus `GET /livez`.

The launcher runs it on a daemon thread of its own process, which is SGLang's main process: it shares the
ranks' pid namespace (it checks their pids and signals them for stacks) and reads the ledger path they write
(`PDFLEET_LEDGER_PATH`, inherited). `/livez` answers 200 whenever the agent can answer at all, and is the
pod's liveness probe: it proves the engine's main process is alive and not wedged with the interpreter held,
and nothing more. Rank health is the operator's judgement, from `/ranks`, never kubelet's.
"""

from __future__ import annotations

import http.server
import threading

from pdfleet.runtime.health import agent

LIVEZ = "/livez"


class _Handler(agent._Handler):
    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == LIVEZ:
            self._send(200, {"alive": True})
        else:
            super().do_GET()


class PodAgent(agent.Agent):
    """`Agent` with `/livez`. Bind and thread exactly as `Agent.start` does, with the extended handler."""

    def start(self) -> PodAgent:
        server = http.server.ThreadingHTTPServer(self._bind, _Handler)
        server.daemon_threads = True
        server.agent = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="pdfleet-health-agent", daemon=True)
        self._thread.start()
        return self
