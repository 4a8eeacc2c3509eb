"""Run time of the tool-call canary for 256 concurrent requests, against the same requests sent bare through
the same `openai` client (answers read, nothing judged), in the same process, against one simulated engine.

The engine (the launcher in simulate mode on 127.0.0.1, no PD, 256 running slots so it never queues) answers
every tool request with a structured call and plain ones with text, 32 tokens at the simulator's default 10 ms
a decode step: the floor is what the engine takes; what the canary adds over it is streaming accumulation,
verdicts and the report. Each side is run `--repeats` times, alternating; the median is reported.

    python benchmarks/bench_toolcall_canary.py [--requests N] [--repeats R]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx
import openai

from pdfleet.operator.engines import canary_requests
from pdfleet.operator.planning.rollout import toolcall_canary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_engine(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port, agent = free_port(), free_port()
    env = {**os.environ, "PDFLEET_ENGINE_MODE": "simulate", "PDFLEET_BIND_ADDRESS": "127.0.0.1",
           "PDFLEET_LEDGER_PATH": str(tmp / "ledger"), "PDFLEET_PODINFO": str(tmp), "HF_HUB_OFFLINE": "1",
           "PDFLEET_SIM_MAX_RUNNING": "256"}
    log = (tmp / "engine.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "pdfleet.runtime.launcher", "--agent-port", str(agent), "--", "--model-path",
         "/models/sim", "--served-model-name", "sim-model", "--host", "0.0.0.0", "--port", str(port),
         "--tp-size", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the simulated engine exited: {(tmp / 'engine.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return process, url
        except OSError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit("the simulated engine did not become healthy in 120 s")


async def bare(url: str, requests: int) -> float:
    """The canary's requests through the same client, answers read to the end, nothing judged."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60,
                                http_client=openai.DefaultAsyncHttpxClient(
                                    limits=httpx.Limits(max_connections=requests)))

    async def one(probe: toolcall_canary.Probe) -> None:
        answer = await client.chat.completions.create(**toolcall_canary.body(probe, model="sim-model", max_tokens=32))
        if probe.stream:
            async for _ in answer:  # type: ignore[union-attr]
                pass

    started = time.monotonic()
    async with client:
        await asyncio.gather(*(one(p) for p in toolcall_canary.plan(requests)))
    return time.monotonic() - started


async def canary(url: str, requests: int) -> float:
    started = time.monotonic()
    report = await canary_requests.run(url, requests=requests, concurrency=requests)
    elapsed = time.monotonic() - started
    if not report.passed:
        raise SystemExit(f"the canary failed against a healthy engine: {report.failures()}")
    return elapsed


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--requests", type=int, default=256)
    args.add_argument("--repeats", type=int, default=5)
    opts = args.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        process, url = start_engine(Path(tmp))
        try:
            asyncio.run(canary(url, 16))  # warm: connections, imports
            base, judged = [], []
            for _ in range(opts.repeats):
                base.append(asyncio.run(bare(url, opts.requests)))
                judged.append(asyncio.run(canary(url, opts.requests)))
        finally:
            process.terminate()
            process.wait(30)
    b, c = statistics.median(base), statistics.median(judged)
    print(f"canary, {opts.requests} concurrent requests (half with tools, streamed and not): {c:.2f} s median "
          f"(min {min(judged):.2f}); the same requests bare through the openai client: {b:.2f} s; "
          f"canary/bare {c / b:.2f}x")


if __name__ == "__main__":
    main()
