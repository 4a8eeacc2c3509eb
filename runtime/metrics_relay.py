"""The engine pod's metrics-only port: `GET /metrics`, relayed from the local engine, and nothing else.

SGLang serves Prometheus `/metrics` on its main HTTP port, beside its generate API and its admin endpoints (cache
flush, profiling, aborts, ...). A NetworkPolicy selects ports, not paths, so a Prometheus let onto that port could
call all of them. This relay gives the pod a port of its own for metrics (`DEFAULT_PORT`, rendered as the
container port `metrics`, opened by the pool's `spec.networkPolicy.metricsFrom`):

    GET /metrics, HEAD /metrics   the engine's own answer to GET /metrics: status, Content-Type and body
    anything else                 404 (another path) or 405 (another method on /metrics), never forwarded

It fetches one fixed URL, the engine as seen from inside its own pod, so no request can steer it elsewhere; only
the client's `Accept` goes along (prometheus_client picks the exposition format from it). An engine that is not
listening yet (loading weights) answers 503, one that does not answer within `TIMEOUT_S` 504, one whose answer is
larger than `MAX_BODY_BYTES` 502, each with a one-line reason. At most `MAX_CONCURRENT` fetches run at once; more
get 503 with Retry-After, so that whoever may reach this port cannot pile requests onto the engine through it.

Served from a daemon thread of the launcher, as the rank-health agent is. Standard library only.
"""

from __future__ import annotations

import http.client
import http.server
import logging
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

from pdfleet.runtime import daemon_http

log = logging.getLogger(__name__)

DEFAULT_PORT = 8471  # the one place the metrics port is set, beside the agent's 8470; the operator renders it
PATH = "/metrics"
# Below Prometheus' default scrape timeout (10 s), so a slow engine gets this relay's 504 with its reason rather
# than the scraper's own timeout with none.
TIMEOUT_S = 8.0
MAX_BODY_BYTES = 32 * 1024 * 1024  # SGLang's exposition is well under a megabyte; this bounds a broken one
MAX_CONCURRENT = 4
FORWARDED_HEADERS = ("Accept",)


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes
    retry_after_s: int | None = None


def _reason(status: int, text: str, retry_after_s: int | None = None) -> Answer:
    return Answer(status, "text/plain; charset=utf-8", (text + "\n").encode(), retry_after_s)


class MetricsRelay(daemon_http.DaemonHTTPServer):
    """Relays `GET /metrics` to the engine at `engine_host`:`engine_port`. `start()` binds `host`:`port` (port 0:
    an ephemeral port) and serves from a daemon thread."""

    thread_name = "pdfleet-metrics-relay"

    def __init__(self, engine_host: str, engine_port: int, *, host: str = "0.0.0.0", port: int = DEFAULT_PORT,
                 timeout_s: float = TIMEOUT_S, max_concurrent: int = MAX_CONCURRENT) -> None:
        super().__init__(host=host, port=port)
        self.engine_host = engine_host
        self.engine_port = engine_port
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_concurrent)

    @classmethod
    def for_engine_url(cls, url: str, **kwargs: Any) -> MetricsRelay:
        """A relay for the engine at `url` (`drain.local_url`'s form: http://host:port)."""
        parts = urllib.parse.urlsplit(url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"not an engine URL with a host and port: {url}")
        return cls(parts.hostname, parts.port, **kwargs)

    def fetch(self, headers: dict[str, str]) -> Answer:
        """The engine's answer to GET /metrics, or why there is none."""
        if not self._slots.acquire(blocking=False):
            return _reason(503, "busy: other scrapes of this engine are in flight", retry_after_s=1)
        try:
            return self._fetch(headers)
        finally:
            self._slots.release()

    def _fetch(self, headers: dict[str, str]) -> Answer:
        where = f"{self.engine_host}:{self.engine_port}"
        # http.client, not urllib: urllib would send the request through a proxy named in the environment.
        conn = http.client.HTTPConnection(self.engine_host, self.engine_port, timeout=self.timeout_s)
        try:
            conn.request("GET", PATH, headers=headers)
            response = conn.getresponse()
            body = response.read(MAX_BODY_BYTES + 1)
            if len(body) > MAX_BODY_BYTES:
                return _reason(502, f"the engine's /metrics is larger than {MAX_BODY_BYTES} bytes")
            return Answer(response.status, response.getheader("Content-Type") or "text/plain", body)
        except ConnectionRefusedError:
            return _reason(503, f"the engine is not serving yet (nothing listens on {where})")
        except TimeoutError:
            return _reason(504, f"the engine did not answer /metrics within {self.timeout_s:g} s")
        except (OSError, http.client.HTTPException) as e:
            return _reason(502, f"the engine's /metrics failed: {e!r}")
        finally:
            conn.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "pdfleet-metrics-relay"
    protocol_version = "HTTP/1.1"  # Prometheus keeps its connection open between scrapes

    def do_GET(self) -> None:
        self._metrics(head=False)

    def do_HEAD(self) -> None:
        self._metrics(head=True)

    def __getattr__(self, name: str) -> Any:
        # Every other method, including ones http.server has never heard of (which it would answer 501), is refused
        # here like a known one, so no method reaches past this handler.
        if name.startswith("do_"):
            return self._refuse
        raise AttributeError(name)

    def _refuse(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if path == PATH:
            self._send(_reason(405, f"only GET and HEAD {PATH}"), head=False, allow="GET, HEAD")
        else:
            self._send(_reason(404, f"this port serves {PATH} only"), head=False)

    def _metrics(self, *, head: bool) -> None:
        if urllib.parse.urlsplit(self.path).path != PATH:
            self._send(_reason(404, f"this port serves {PATH} only"), head=head)
            return
        relay: MetricsRelay = self.server.owner  # type: ignore[attr-defined]
        forwarded = {name: value for name in FORWARDED_HEADERS if (value := self.headers.get(name)) is not None}
        self._send(relay.fetch(forwarded), head=head)

    def _send(self, answer: Answer, *, head: bool, allow: str | None = None) -> None:
        # A request body is never read: drop the connection after answering one that came with a body.
        if self.headers.get("Content-Length") not in (None, "0") or self.headers.get("Transfer-Encoding"):
            self.close_connection = True
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        if answer.retry_after_s is not None:
            self.send_header("Retry-After", str(answer.retry_after_s))
        if allow is not None:
            self.send_header("Allow", allow)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if not head:
            self.wfile.write(answer.body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


MetricsRelay.handler = _Handler
