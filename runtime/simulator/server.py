"""The simulated engine's lifetime: start the ranks, serve, drain on SIGTERM, take every rank down.

    run(parsed, sglang_args) -> exit code

Order matters: the fault watcher reads the environment before the ranks fork (a fault asked for at start
applies from the first iteration); the HTTP side serves at once, SGLang's argument resolution (seconds)
runs in a thread meanwhile and /server_info waits for it. SIGTERM is SGLang's graceful exit: /health
answers 503, new requests are refused, in-flight ones may finish within `drain_s`, then the ranks stop
(their writers closed) and the process exits 0. The ranks also die with this process if it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from pdfleet.runtime.simulator import faults, info, kv, native_api, openai_api, rendezvous
from pdfleet.runtime.simulator.config import Engine, Timing
from pdfleet.runtime.simulator.ranks import Control, RankGroup
from pdfleet.runtime.simulator.scheduler import Scheduler
from pdfleet.runtime.simulator.state import State
from pdfleet.runtime.simulator.ticks import Ticks

log = logging.getLogger(__name__)

EXIT_CRASH = 1


def _say(message: str) -> None:
    print(f"pdfleet-engine (simulated): {message}", file=sys.stderr, flush=True)


def run(parsed: argparse.Namespace, sglang_args: list[str], *, bind: str, env: Mapping[str, str] = os.environ) -> int:
    """Serve as the engine these (already checked) SGLang arguments describe, on `bind` (the pod's address),
    until SIGTERM."""
    try:
        engine = Engine.from_args(parsed, env)
        timing = Timing.from_env(env, max_running=getattr(parsed, "max_running_requests", None),
                                 context_len=getattr(parsed, "context_length", None),
                                 max_prefill_tokens=getattr(parsed, "max_prefill_tokens", None))
        first = faults.from_env(env)
        crossing = rendezvous.Crossing.of(nnodes=engine.nnodes, node_rank=engine.node_rank, world=engine.tp_size,
                                          dist_init_addr=engine.dist_init_addr, bind=bind, env=env)
    except ValueError as e:
        _say(str(e))
        return EXIT_CRASH
    if first.fault is faults.Fault.CRASH_AT_START:
        _say(f"crashing at start, as {faults.ENV_FAULT}=crash-at-start asks")
        return EXIT_CRASH
    return asyncio.run(_serve(engine, timing, sglang_args, env, host=bind, crossing=crossing,
                              enable_metrics=bool(parsed.enable_metrics)))


async def _serve(engine: Engine, timing: Timing, sglang_args: list[str], env: Mapping[str, str], *, host: str,
                 crossing: rendezvous.Crossing | None, enable_metrics: bool) -> int:
    loop = asyncio.get_running_loop()
    control = Control(engine.local_ranks, crossing)
    stop = asyncio.Event()
    crashed: list[faults.Asked] = []

    def apply(asked: faults.Asked) -> None:
        control.ask(asked)
        if asked.fault is faults.Fault.CRASH:  # from the watcher's thread: end the process as a fatal error does
            loop.call_soon_threadsafe(lambda: (crashed.append(asked), stop.set()))

    watcher = faults.Watcher(env, apply, requests=lambda: control.requests).start()
    ranks = RankGroup(engine, timing, control).start()
    ticks = Ticks(ranks.tick_read)
    ticks.attach(loop)
    rooms = kv.Rooms(timing.kv_wait_s)
    scheduler = Scheduler(engine, timing, ticks, control, rooms)
    resolved = loop.run_in_executor(None, info.resolve_server_args, sglang_args)
    state = State(engine, timing, scheduler, control, resolved)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runners: list[web.AppRunner] = []
    meeting: rendezvous.Server | None = None
    try:
        if crossing is not None and crossing.leader:
            # After the ranks forked, so that none of them holds the listening socket; they retry until it listens.
            meeting = rendezvous.Server(crossing).start()
        async with aiohttp.ClientSession() as session:
            scheduler.session = session
            app = web.Application()
            app[native_api.STATE] = state
            leader = engine.node_rank == 0
            native_api.add_routes(app, leader=leader, enable_metrics=enable_metrics)
            if leader:
                openai_api.add_routes(app)
            if engine.mode == "prefill" and leader:
                runners.append(await _listen(kv.bootstrap_app(engine, rooms, timing.kv_wait_s), host,
                                             engine.bootstrap_port))
            # SGLang loads the model before it starts its HTTP server: nothing answers on the port meanwhile.
            if timing.load_s:
                await asyncio.wait([asyncio.ensure_future(stop.wait())], timeout=timing.load_s)
            runners.append(await _listen(app, host, engine.port))
            state.ready = True
            _say(f"serving {engine.mode} engine on {host}:{engine.port}, {engine.local_ranks} rank(s) "
                 f"(pids {', '.join(map(str, ranks.pids()))}), loop {engine.loop().method}"
                 + (f"; node {crossing.node_rank} of {crossing.nnodes}, collectives across pods through "
                    f"{crossing.leader_host}:{crossing.port}" if crossing is not None else ""))
            await stop.wait()
            if crashed:
                _say("crashing, as the crash fault asks" + (f" ({crashed[0].after_s:g} s, "
                                                             f"{crashed[0].after_requests} requests after start)"
                                                             if crashed[0].delayed else ""))
                return EXIT_CRASH
            state.shutting_down = True
            _say(f"SIGTERM: draining {scheduler.in_flight} in-flight request(s), at most {timing.drain_s:.0f} s")
            drained = await scheduler.wait_idle(timing.drain_s)
            _say("drained" if drained else f"gave up draining with {scheduler.in_flight} in flight")
    except OSError as e:
        _say(f"cannot serve: {e}")
        return EXIT_CRASH
    finally:
        watcher.stop()
        ticks.detach()
        for runner in reversed(runners):
            await runner.cleanup()
        await loop.run_in_executor(None, ranks.stop)
        if meeting is not None:
            meeting.close()
    return 0


class _OneLineBadRequests(logging.Filter):
    """sglang-router probes every worker with HTTP/2 `PRI *` preambles at registration. SGLang's uvicorn answers
    them with one warning line; aiohttp logs a traceback each. Keep the line, drop the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], BadHttpMessage):
            record.msg, record.args = "invalid HTTP request received: %s", (record.exc_info[1].message,)
            record.exc_info = None
        return True


logging.getLogger("aiohttp.server").addFilter(_OneLineBadRequests())


async def _listen(app: web.Application, host: str, port: int) -> web.AppRunner:
    # A client that goes away aborts its request, as SGLang aborts on disconnect: a drain never waits for it.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, shutdown_timeout=1.0).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner
