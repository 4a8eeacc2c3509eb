"""A simulated engine as a real process: the launcher with PDFLEET_ENGINE_MODE=simulate on 127.0.0.1."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.support import forkserver
from tests.support.cluster import wait_for
from tests.support.operator_process import free_port

# Forked from the test process's zygote, an engine skips the 10-20 s of CPU an import of SGLang takes (the first pays
# the zygote's); a module that started six at once as fresh processes on a 2-core machine shared with other work
# was seen to need more than 120 s (a wait for a condition: a healthy engine ends it at once).
STARTUP_S = 240.0


@dataclasses.dataclass
class SimEngine:
    role: str
    port: int
    agent_port: int
    bootstrap_port: int
    metrics_port: int  # the launcher's metrics relay, as an engine pod's
    podinfo: Path
    log: Path
    process: forkserver.Forked

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def agent_url(self) -> str:
        return f"http://127.0.0.1:{self.agent_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def annotate(self, **annotations: str) -> None:
        """Rewrite the pod's annotations file atomically, as kubelet does (Go-quoted values)."""
        text = "".join(f'sim.pdfleet.dev/{k.replace("_", "-")}="{v}"\n' for k, v in annotations.items())
        tmp = self.podinfo / ".annotations.tmp"
        tmp.write_text(text)
        tmp.replace(self.podinfo / "annotations")

    def ranks(self) -> dict[str, Any]:
        return dict(httpx.get(self.agent_url + "/ranks", timeout=10).json())

    def wait_healthy(self, deadline: float) -> None:
        until(lambda: self._healthy(), deadline, f"{self.role} engine healthy (log: {self.log})")

    def _healthy(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.role} engine exited {self.process.returncode}: {self.log.read_text()[-3000:]}")
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM, then wait (the interpreter's exit after SGLang's imports takes seconds), then kill."""
        self.terminate()
        if self.process.poll() is None:
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def until(condition: Callable[[], Any], deadline: float, what: str, interval: float = 0.05) -> Any:
    """Poll `condition` until it returns something truthy (returned), or fail at `deadline` (monotonic)."""
    return wait_for(what, condition, timeout=max(interval, deadline - time.monotonic()), interval=interval)


def start(tmp: Path, role: str, *, tp: int = 2, extra: list[str] | None = None,
          env: dict[str, str] | None = None) -> SimEngine:
    """Start one engine; `role` is prefill, decode or null (no disaggregation)."""
    port, agent_port, bootstrap_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    podinfo = tmp / f"{role}-{port}"
    podinfo.mkdir(parents=True)
    args = ["--model-path", "/models/sim", "--served-model-name", "sim-model", "--host", "0.0.0.0",
            "--port", str(port), "--tp-size", str(tp), "--enable-metrics", *(extra or [])]
    if role != "null":
        args += ["--disaggregation-mode", role]
    if role == "prefill":
        args += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    log = podinfo / "engine.log"
    full_env = {**os.environ, "PDFLEET_ENGINE_MODE": "simulate", "PDFLEET_BIND_ADDRESS": "127.0.0.1",
                "PDFLEET_LEDGER_PATH": str(podinfo / "ledger"), "PDFLEET_PODINFO": str(podinfo),
                "HF_HUB_OFFLINE": "1", **(env or {})}
    # `python -m pdfleet.runtime.launcher ...`, forked as the local cluster's pod runner forks an engine pod's.
    process = forkserver.shared().spawn("pdfleet.runtime.launcher", ["--agent-port", str(agent_port), "--metrics-port",
                                                                     str(metrics_port), "--", *args],
                                        env=full_env, log=log)
    return SimEngine(role, port, agent_port, bootstrap_port, metrics_port, podinfo, log, process)


@contextlib.contextmanager
def serving(engines: dict[str, SimEngine]) -> Iterator[dict[str, SimEngine]]:
    """`engines` (started at once: each pays SGLang's import in parallel), once every one is healthy; all stopped
    on exit, SIGTERM to all first (each exit takes seconds)."""
    try:
        deadline = time.monotonic() + STARTUP_S
        for engine in engines.values():
            engine.wait_healthy(deadline)
        yield engines
    finally:
        for engine in engines.values():
            engine.terminate()
        for engine in engines.values():
            engine.stop()


@contextlib.contextmanager
def pd_pair(tmp: Path) -> Iterator[tuple[SimEngine, SimEngine]]:
    """A simulated prefill and decode engine (TP 1 each), healthy, stopped on exit."""
    with serving({"prefill": start(tmp, "prefill", tp=1), "decode": start(tmp, "decode", tp=1)}) as engines:
        yield engines["prefill"], engines["decode"]


ROUTER_STARTUP_S = 60.0


@dataclasses.dataclass
class Router:
    port: int
    metrics_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _router_health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return int(r.status) == 200
    except OSError:
        return False


@contextlib.contextmanager
def router(tmp: Path, prefill: SimEngine | Sequence[SimEngine], decode: SimEngine | Sequence[SimEngine],
           extra: Sequence[str] = ()) -> Iterator[Router]:
    """The real sglang-router in PD mode on 127.0.0.1 in front of `prefill` and `decode` (one engine or several),
    with `extra` arguments, answering /health; stopped on exit."""
    prefills = [prefill] if isinstance(prefill, SimEngine) else list(prefill)
    decodes = [decode] if isinstance(decode, SimEngine) else list(decode)
    workers = [*(a for p in prefills for a in ("--prefill", p.url, str(p.bootstrap_port))),
               *(a for d in decodes for a in ("--decode", d.url))]
    port, metrics = free_port(), free_port()
    log_path = tmp / f"router-{port}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation", *workers,
             "--host", "127.0.0.1", "--port", str(port),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics), *extra],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            def up() -> bool:
                assert process.poll() is None, f"sglang-router exited: {log_path.read_text()[-2000:]}"
                return _router_health(port)
            until(up, time.monotonic() + ROUTER_STARTUP_S, "sglang-router answers /health", interval=0.2)
            yield Router(port, metrics)
        finally:
            # The router drains on SIGTERM and has been seen to take over 10 s on a loaded machine; what is
            # under test has been read by then, so a router that lingers is killed rather than failing teardown.
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
