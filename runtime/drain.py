"""`python -m pdfleet.runtime.drain`: the engine container's preStop hook. Wait, bounded, for the local
engine's in-flight requests to finish before kubelet sends SIGTERM.

What stops new work: by the time preStop runs, the pod is terminating, so Kubernetes has taken it out of its
Services' endpoints and the router's pod discovery drops it (the operator also removes a group from the
router before replacing it). SGLang 0.5.23 has no HTTP endpoint that closes admission and lets in-flight
requests finish: `/pause_generation` holds new requests but also pauses, retracts or aborts the running ones,
and SGLang's own drain (`/health` answers 503, then it waits for `rid_to_state` to empty) starts only on
SIGTERM, which kubelet sends after this hook returns. So this hook does the waiting part, against
SGLang's `GET /v1/loads`: running plus waiting requests of every DP rank, and with PD disaggregation the
bootstrap, in-flight KV transfer, prealloc, transfer and retracted queues too. It returns when that count is
zero twice in a row, when the engine stops answering (nothing left to wait for), or at the deadline; it
always exits 0 (kubelet kills the container at the grace period anyway) and logs every decision.

Where the engine is: `--url`, else $PDFLEET_ENGINE_URL, else the endpoint file the launcher writes beside
the rank ledger (`endpoint_path()`), else SGLang's default http://127.0.0.1:30000. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from pdfleet.runtime.health import ledger

URL_ENV = "PDFLEET_ENGINE_URL"
TIMEOUT_ENV = "PDFLEET_DRAIN_TIMEOUT_S"
DEFAULT_URL = "http://127.0.0.1:30000"
DEFAULT_TIMEOUT_S = 150.0  # spec.<role>.drainSeconds' default; the grace period adds 30 s for SGLang's shutdown
LOADS_PATH = "/v1/loads?include=core,disagg"
_DISAGG_QUEUES = ("prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs", "decode_prealloc_queue_reqs",
                  "decode_transfer_queue_reqs", "decode_retracted_queue_reqs")
_SETTLED_POLLS = 2


class EngineGone(Exception):
    """The engine does not answer at all: nothing in flight can finish any more."""


def endpoint_path() -> Path:
    """Where the launcher records the engine's URL: beside the ledger, on the pod's /dev/shm."""
    path = ledger.default_path()
    return path.with_name(f"{path.name}.engine.json")


def write_endpoint(url: str, path: Path | None = None) -> None:
    """Launcher side: record the URL the drain should poll."""
    target = path if path is not None else endpoint_path()
    tmp = target.with_name(f"{target.name}.tmp")
    tmp.write_text(json.dumps({"url": url}))
    tmp.replace(target)


def engine_url(*, explicit: str | None, env: Mapping[str, str], endpoint_file: Path) -> str:
    if explicit:
        return explicit
    if env.get(URL_ENV):
        return env[URL_ENV]
    try:
        return str(json.loads(endpoint_file.read_text())["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_URL


def local_url(host: str, port: int) -> str:
    """The URL of an engine serving on `host`:`port`, as seen from inside its own pod."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def in_flight(loads: Mapping[str, Any]) -> int:
    """Requests the engine still owes an answer, from a `/v1/loads` body."""
    total = 0
    for load in loads.get("loads", []):
        total += int(load.get("num_running_reqs", 0)) + int(load.get("num_waiting_reqs", 0))
        disagg = load.get("disaggregation") or {}
        total += sum(int(disagg.get(name, 0)) for name in _DISAGG_QUEUES)
    return total


def fetch_loads(url: str, *, timeout_s: float = 5.0) -> dict[str, Any]:
    """GET /v1/loads. Raises EngineGone when nothing listens; other failures raise OSError or ValueError."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + LOADS_PATH, timeout=timeout_s) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError:
        raise
    except urllib.error.URLError as e:
        if isinstance(e.reason, ConnectionRefusedError):
            raise EngineGone(str(e.reason)) from None
        raise


def wait_until_drained(fetch: Callable[[], Mapping[str, Any]], *, timeout_s: float, interval_s: float,
                       log: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], None] = time.sleep) -> str:
    """Poll until nothing is in flight (`_SETTLED_POLLS` zero readings in a row), the engine is gone, or
    `timeout_s` passed. Returns how it ended: 'drained', 'gone', 'timeout' or 'unavailable'."""
    deadline = clock() + timeout_s
    zeros, last = 0, None
    while True:
        try:
            count = in_flight(fetch())
        except EngineGone as e:
            log(f"the engine no longer answers ({e}): nothing left to wait for")
            return "gone"
        except urllib.error.HTTPError as e:
            if e.code in (404, 405):
                log(f"the engine has no {LOADS_PATH} ({e.code}): cannot see its requests, not waiting")
                return "unavailable"
            log(f"the engine answers {e.code} to {LOADS_PATH}; trying again")
            count = None
        except (OSError, ValueError) as e:
            log(f"reading the engine's load failed ({e}); trying again")
            count = None
        if count == 0:
            zeros += 1
            if zeros >= _SETTLED_POLLS:
                log("no requests in flight: drained")
                return "drained"
        else:
            zeros = 0
            if count is not None and count != last:
                log(f"{count} requests in flight; waiting up to {max(0.0, deadline - clock()):.0f} s more")
            last = count
        if clock() >= deadline:
            log(f"gave up after {timeout_s:.0f} s with {last} requests in flight; kubelet stops the engine now")
            return "timeout"
        sleep(interval_s)


def container_log(proc: Path = Path("/proc")) -> TextIO | None:
    """The container's own log, when this hook runs beside the engine as the first process of its container (a
    kubelet's exec hook: its output is kept only when it fails, so the drain's decisions would be lost): the
    engine's stderr, opened for appending. None elsewhere (the local fleet's pod runner logs the hook's own
    output with the container's, and its pid 1 is no engine's)."""
    try:
        if b"pdfleet.runtime.launcher" not in (proc / "1" / "cmdline").read_bytes():
            return None
        return open(proc / "1" / "fd" / "2", "a")  # lives as long as the hook
    except OSError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pdfleet-drain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="the engine's base URL (default: see above)")
    parser.add_argument("--timeout", type=float, default=float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S),
                        help="seconds to wait at most")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between two polls")
    options = parser.parse_args(argv)
    url = engine_url(explicit=options.url, env=os.environ, endpoint_file=endpoint_path())

    also = container_log()

    def log(message: str) -> None:
        print(f"pdfleet-drain: {message}", file=sys.stderr, flush=True)
        if also is not None:
            print(f"pdfleet-drain: {message}", file=also, flush=True)

    log(f"draining the engine at {url} (at most {options.timeout:.0f} s)")
    started = time.monotonic()
    outcome = wait_until_drained(lambda: fetch_loads(url), timeout_s=options.timeout, interval_s=options.interval,
                                 log=log)
    log(f"{outcome} after {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
