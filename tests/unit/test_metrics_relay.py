"""The engine pod's metrics-only port (runtime/metrics_relay.py), against a real HTTP server playing the engine on
127.0.0.1: GET /metrics passes, with the engine's status, content type and body; nothing else reaches the engine."""

from __future__ import annotations

import argparse
import http.client
import http.server
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from pdfleet.runtime import drain, launcher, metrics_relay
from pdfleet.runtime.metrics_relay import MetricsRelay
from tests.support.cluster import wait_for
from tests.support.ports import free_port

EXPOSITION = b'# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{tp_rank="0"} 3.0\n'
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Engine:
    """What the engine was asked, and how it answers /metrics."""

    server: http.server.ThreadingHTTPServer
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    status: int = 200
    held: threading.Event | None = None  # set: /metrics waits for it before answering
    arrived: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        return self.server.server_address[1]


class _EngineHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        engine: Engine = self.server.engine  # type: ignore[attr-defined]
        engine.seen.append((self.command, self.path, dict(self.headers)))
        engine.arrived.set()
        if self.path == "/metrics" and engine.held is not None:
            engine.held.wait(30)
        body = EXPOSITION if self.path == "/metrics" else b'{"flushed": true}'
        self.send_response(engine.status if self.path == "/metrics" else 200)
        self.send_header("Content-Type", PROMETHEUS_TYPE if self.path == "/metrics" else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[Engine]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EngineHandler)
    server.daemon_threads = True
    playing = Engine(server)
    server.engine = playing  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield playing
    if playing.held is not None:
        playing.held.set()
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def relay(engine: Engine) -> Iterator[MetricsRelay]:
    with MetricsRelay("127.0.0.1", engine.port, host="127.0.0.1", port=0) as running:
        yield running


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def ask(relay: MetricsRelay, method: str, path: str, *, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def test_get_metrics_relays_the_engines_status_content_type_and_body(engine: Engine, relay: MetricsRelay) -> None:
    reply = ask(relay, "GET", "/metrics", headers={"Accept": "application/openmetrics-text", "X-Other": "no"})
    assert (reply.status, reply.headers["content-type"], reply.body) == (200, PROMETHEUS_TYPE, EXPOSITION)
    [(method, path, headers)] = engine.seen
    assert (method, path) == ("GET", "/metrics")
    assert headers["Accept"] == "application/openmetrics-text", "prometheus_client picks its format from Accept"
    assert "X-Other" not in headers, "only Accept goes along"

    head = ask(relay, "HEAD", "/metrics")
    assert (head.status, head.body, head.headers["content-length"]) == (200, b"", str(len(EXPOSITION)))
    # A query is not passed on: the relay asks one fixed URL.
    assert ask(relay, "GET", "/metrics?name[]=x").status == 200
    assert [p for _, p, _ in engine.seen] == ["/metrics"] * 3


def test_the_engines_own_error_is_relayed(engine: Engine, relay: MetricsRelay) -> None:
    engine.status = 404  # an engine started without --enable-metrics
    assert ask(relay, "GET", "/metrics").status == 404


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/flush_cache", 404), ("POST", "/flush_cache", 404), ("POST", "/generate", 404),
    ("GET", "/server_info", 404), ("GET", "/", 404), ("GET", "/metrics/../flush_cache", 404),
    ("GET", "http://127.0.0.1:30000/flush_cache", 404), ("DELETE", "/metrics", 405), ("POST", "/metrics", 405),
    ("PUT", "/metrics", 405), ("OPTIONS", "/metrics", 405), ("PURGE", "/metrics", 405), ("PURGE", "/x", 404),
])
def test_nothing_but_get_metrics_reaches_the_engine(engine: Engine, relay: MetricsRelay, method: str, path: str,
                                                    status: int) -> None:
    body = b'{"text": "hi"}' if method in ("POST", "PUT") else None
    reply = ask(relay, method, path, body=body)
    assert reply.status == status, reply.body
    if status == 405:
        assert reply.headers["allow"] == "GET, HEAD"
    assert engine.seen == []
    # The connection that carried a refused request leaves the relay answering the next one.
    assert ask(relay, "GET", "/metrics").status == 200


def test_an_engine_not_listening_yet_gives_503_with_the_reason() -> None:
    with socket.socket() as reserved:  # bound and not listening: connections to it are refused
        reserved.bind(("127.0.0.1", 0))
        with MetricsRelay("127.0.0.1", reserved.getsockname()[1], host="127.0.0.1", port=0) as running:
            reply = ask(running, "GET", "/metrics")
    assert reply.status == 503
    assert b"not serving yet" in reply.body


def test_an_engine_that_does_not_answer_gives_504_within_the_timeout(engine: Engine) -> None:
    engine.held = threading.Event()
    with MetricsRelay("127.0.0.1", engine.port, host="127.0.0.1", port=0, timeout_s=0.3) as running:
        reply = ask(running, "GET", "/metrics")
    assert reply.status == 504 and b"within 0.3 s" in reply.body


def test_scrapes_beyond_the_bound_are_turned_away_not_queued_on_the_engine(engine: Engine) -> None:
    engine.held = threading.Event()
    with MetricsRelay("127.0.0.1", engine.port, host="127.0.0.1", port=0, max_concurrent=1) as running:
        first: list[Reply] = []
        thread = threading.Thread(target=lambda: first.append(ask(running, "GET", "/metrics")))
        thread.start()
        wait_for("the first scrape at the engine", engine.arrived.is_set, timeout=10, interval=0.01)
        second = ask(running, "GET", "/metrics")
        engine.held.set()
        thread.join(10)
    assert second.status == 503 and second.headers["retry-after"] == "1"
    assert [r.status for r in first] == [200]
    assert len(engine.seen) == 1


def test_the_launcher_relays_its_engine_from_where_the_engine_listens(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    sglang = argparse.Namespace(host="0.0.0.0", port=engine.port)
    assert launcher.start_metrics_relay(0, sglang) is None
    # The pod's own address when the pod runner names one (as the local fleet does), else SGLang's --host.
    monkeypatch.setenv(launcher.BIND_ENV, "127.0.0.1")
    running = launcher.start_metrics_relay(free_port(), sglang)
    assert running is not None
    try:
        assert (running.engine_host, running.engine_port) == ("127.0.0.1", engine.port)
        assert ask(running, "GET", "/metrics").body == EXPOSITION
    finally:
        running.stop()
    # SGLang on every address (a real pod: --host 0.0.0.0): asked over loopback.
    everywhere = MetricsRelay.for_engine_url(drain.local_url("0.0.0.0", 31000))
    assert (everywhere.engine_host, everywhere.engine_port) == ("127.0.0.1", 31000)
    assert metrics_relay.DEFAULT_PORT == 8471, "docs/security.md and the examples name it"
