"""The preStop drain waits for the engine's in-flight requests, read from a stand-in for SGLang's
`GET /v1/loads` on 127.0.0.1, and always exits 0: drained, engine gone, endpoint missing, or timed out."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdfleet.runtime import drain


def loads(*per_rank: int, **disagg: int) -> dict[str, Any]:
    """A `/v1/loads` body (0.5.23 shape, include=core,disagg) with `per_rank` running requests per DP rank."""
    return {"timestamp": "t", "version": "0.5.23", "accelerator": None, "num_accelerators": 1,
            "loads": [{"dp_rank": i, "num_running_reqs": n, "num_waiting_reqs": 0,
                       **({"disaggregation": {"mode": "decode", **disagg}} if disagg else {})}
                      for i, n in enumerate(per_rank)]}


class FakeEngine:
    """Answers `/v1/loads` from a script of bodies (the last one repeats) and counts the polls."""

    def __init__(self, script: list[dict[str, Any]], status: int = 200) -> None:
        self.script, self.status, self.paths = script, status, []
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                engine.paths.append(self.path)
                body = json.dumps(engine.script[min(len(engine.paths), len(engine.script)) - 1]).encode()
                self.send_response(engine.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[FakeEngine]:
    fake = FakeEngine(*request.param)
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()
    fake.thread.join()


def run(url: str, *extra: str) -> int:
    return drain.main(["--url", url, "--interval", "0.01", *extra])


@pytest.mark.parametrize("engine", [([loads(2, 1), loads(1, 0), loads(0, 0)],)], indirect=True)
def test_it_waits_until_nothing_is_in_flight(engine: FakeEngine, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(engine.url, "--timeout", "30") == 0
    err = capsys.readouterr().err
    assert "3 requests in flight" in err and "1 requests in flight" in err and "drained" in err
    assert len(engine.paths) == 4  # two zero readings in a row
    assert engine.paths[0] == "/v1/loads?include=core,disagg"


@pytest.mark.parametrize("engine", [([loads(0, decode_transfer_queue_reqs=2), loads(0)],)], indirect=True)
def test_requests_still_in_kv_transfer_count_as_in_flight(engine: FakeEngine,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert run(engine.url, "--timeout", "30") == 0
    assert "2 requests in flight" in capsys.readouterr().err


@pytest.mark.parametrize("engine", [([loads(5)],)], indirect=True)
def test_it_gives_up_at_the_deadline_and_still_exits_zero(engine: FakeEngine,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert run(engine.url, "--timeout", "0.2") == 0
    assert "gave up after 0 s with 5 requests in flight" in capsys.readouterr().err


@pytest.mark.parametrize("engine", [([{}], 404)], indirect=True)
def test_an_engine_without_the_loads_endpoint_is_not_waited_for(engine: FakeEngine,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run(engine.url, "--timeout", "30") == 0
    assert "has no /v1/loads" in capsys.readouterr().err
    assert len(engine.paths) == 1


def test_an_engine_that_no_longer_listens_has_nothing_left_to_drain(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeEngine([loads(0)])
    url = fake.url
    fake.server.server_close()  # bound once, now nothing listens there
    assert run(url, "--timeout", "30") == 0
    assert "no longer answers" in capsys.readouterr().err


def test_the_engine_url_comes_from_the_flag_then_the_environment_then_the_launchers_file(tmp_path: Path) -> None:
    endpoint = tmp_path / "ledger.engine.json"
    assert drain.engine_url(explicit=None, env={}, endpoint_file=endpoint) == drain.DEFAULT_URL
    drain.write_endpoint(drain.local_url("0.0.0.0", 30001), endpoint)
    assert drain.engine_url(explicit=None, env={}, endpoint_file=endpoint) == "http://127.0.0.1:30001"
    assert drain.engine_url(explicit=None, env={drain.URL_ENV: "http://e:1"}, endpoint_file=endpoint) == "http://e:1"
    assert drain.engine_url(explicit="http://f:2", env={drain.URL_ENV: "http://e:1"}, endpoint_file=endpoint) \
        == "http://f:2"


def test_an_engine_bound_to_one_address_is_reached_there() -> None:
    assert drain.local_url("10.0.0.7", 30000) == "http://10.0.0.7:30000"
    assert drain.local_url("fd00::7", 30000) == "http://[fd00::7]:30000"


@pytest.mark.parametrize("engine", [([loads(1), loads(0)],)], indirect=True)
def test_the_module_runs_as_the_prestop_command_with_the_launchers_endpoint_file(
        engine: FakeEngine, tmp_path: Path) -> None:
    ledger_path = tmp_path / "ledger"
    drain.write_endpoint(engine.url, ledger_path.with_name("ledger.engine.json"))
    env = {**os.environ, "PDFLEET_LEDGER_PATH": str(ledger_path), "PDFLEET_DRAIN_TIMEOUT_S": "30"}
    result = subprocess.run([sys.executable, "-m", "pdfleet.runtime.drain", "--interval", "0.01"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert f"draining the engine at {engine.url}" in result.stderr
    assert "drained after" in result.stderr


def test_the_drain_writes_to_the_container_s_log_only_beside_the_engine(tmp_path: Path) -> None:
    """A kubelet keeps an exec hook's output only when it fails: beside the engine (pid 1 of its container) the
    drain also writes to the engine's stderr, the container's log. Elsewhere (the pod runner, whose pid 1 is the
    machine's init) it writes nowhere else."""
    proc = tmp_path / "proc"
    (proc / "1" / "fd").mkdir(parents=True)
    log = proc / "1" / "fd" / "2"
    log.write_text("")
    (proc / "1" / "cmdline").write_bytes(b"/sbin/init\0")
    assert drain.container_log(proc) is None
    (proc / "1" / "cmdline").write_bytes(b"python3\0-m\0pdfleet.runtime.launcher\0--agent-port=8470\0")
    stream = drain.container_log(proc)
    assert stream is not None
    print("pdfleet-drain: drained", file=stream, flush=True)
    stream.close()
    assert log.read_text() == "pdfleet-drain: drained\n"
    assert drain.container_log(tmp_path / "nowhere") is None
