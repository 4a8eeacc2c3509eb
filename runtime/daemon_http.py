"""An HTTP server of the engine pod served from a daemon thread of the launcher: the rank-health agent's and the
metrics relay's. Standard library only: the runtime runs in SGLang's image."""

from __future__ import annotations

import http.server
import threading
from typing import ClassVar, Self


class DaemonHTTPServer:
    """Serves `handler` on `host`:`port` (port 0: an ephemeral one) from a daemon thread, so that it never keeps
    the engine's process alive. A handler reaches this object as `self.server.owner`."""

    handler: ClassVar[type[http.server.BaseHTTPRequestHandler]]
    thread_name: ClassVar[str]

    def __init__(self, *, host: str, port: int) -> None:
        self._bind = (host, port)
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"{self.thread_name} is not started")
        return self._server.server_address[1]

    def start(self) -> Self:
        server = http.server.ThreadingHTTPServer(self._bind, self.handler)
        server.daemon_threads = True
        server.owner = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
