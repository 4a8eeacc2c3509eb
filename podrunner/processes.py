"""The runner's side of the zygote: start it, ask it for container processes, signal them, learn how they
end. Every container process (forked launcher or exec'd program) is the zygote's child, so this is the one
place that knows about processes."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("pdfleet.podrunner.processes")


class ZygoteDied(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class Exit:
    code: int | None
    signal: int | None


class Process:
    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.exited: asyncio.Future[Exit] = asyncio.get_running_loop().create_future()

    def signal_group(self, sig: int) -> None:
        """Signals the container's whole process group (what a runtime does to the container's cgroup)."""
        self.zygote.send({"op": "signal", "pid": self.pid, "signal": int(sig)})

    async def wait(self) -> Exit:
        return await asyncio.shield(self.exited)


class Zygote:
    def __init__(self, python: str, log_path: Path) -> None:
        self.python = python
        self.log_path = log_path
        self.ready = asyncio.Event()
        self.imported: list[str] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count()
        self._spawning: dict[int, asyncio.Future[Process]] = {}
        self._running: dict[int, Process] = {}
        self._reader: asyncio.Task[None] | None = None
        self.died = asyncio.Event()

    async def start(self) -> None:
        with self.log_path.open("ab") as err:
            self._proc = await asyncio.create_subprocess_exec(
                self.python, "-m", "pdfleet.podrunner.zygote", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=err, limit=1 << 20)
        self._reader = asyncio.create_task(self._read())
        log.info("zygote started", extra={"fields": {"pid": self._proc.pid, "log": str(self.log_path)}})

    async def _read(self) -> None:
        assert self._proc and self._proc.stdout
        while line := await self._proc.stdout.readline():
            message = json.loads(line)
            op = message["op"]
            if op == "ready":
                self.imported = message["imported"]
                log.info("zygote ready", extra={"fields": {"seconds": message["seconds"],
                                                           "imported": len(self.imported)}})
                self.ready.set()
            elif op == "spawned":
                # Registered here, not in spawn(): the exit may be the very next line.
                proc = Process(self, int(message["pid"]))
                self._running[proc.pid] = proc
                self._spawning.pop(message["id"]).set_result(proc)
            elif op == "spawn-failed":
                self._spawning.pop(message["id"]).set_exception(OSError(message["error"]))
            elif op == "exit":
                proc = self._running.pop(int(message["pid"]), None)
                if proc is not None and not proc.exited.done():
                    proc.exited.set_result(Exit(message["code"], message["signal"]))
        code = await self._proc.wait()
        log.error("zygote exited", extra={"fields": {"code": code}})
        self.died.set()
        for future in self._spawning.values():
            future.set_exception(ZygoteDied(f"the zygote exited with {code}"))
        for proc in self._running.values():
            if not proc.exited.done():
                proc.exited.set_result(Exit(None, signal.SIGKILL))

    def send(self, message: Mapping[str, Any]) -> None:
        if self._proc is None or self._proc.stdin is None or self.died.is_set():
            raise ZygoteDied("the zygote is not running")
        self._proc.stdin.write((json.dumps(message) + "\n").encode())

    async def spawn(self, *, mode: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path,
                    log_file: Path) -> Process:
        request_id = next(self._ids)
        future: asyncio.Future[Process] = asyncio.get_running_loop().create_future()
        self._spawning[request_id] = future
        self.send({"op": "spawn", "id": request_id, "mode": mode, "argv": list(argv), "env": dict(env),
                   "cwd": str(cwd), "log": str(log_file)})
        return await future

    async def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.stdin:
            self._proc.stdin.close()  # the zygote exits when its input ends
        try:
            await asyncio.wait_for(self._proc.wait(), 10)
        except TimeoutError:
            self._proc.kill()
        if self._reader:
            await asyncio.gather(self._reader, return_exceptions=True)


def default_python() -> str:
    return sys.executable
