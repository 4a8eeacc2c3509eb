"""One container of a played pod, as kubelet runs it: start the process, probe it, kill it when a probe
says so or the pod goes away (preStop, SIGTERM, SIGKILL at the grace period's end), restart it per the pod's
restartPolicy with kubelet's backoff, and keep its containerStatus true at every step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pdfleet.podrunner import commands, prober, status
from pdfleet.podrunner.backoff import RestartBackoff
from pdfleet.podrunner.node import Node
from pdfleet.podrunner.probes import Kind, ProbeSpec, ProbeState, Result
from pdfleet.podrunner.processes import Exit, Process, ZygoteDied

log = logging.getLogger("pdfleet.podrunner.container")
Body = dict[str, Any]


def should_restart(policy: str, exit_status: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_status != 0)


class Container:
    def __init__(self, node: Node, pod: Callable[[], Body], spec: Body, plan: commands.Plan,
                 env: Mapping[str, str], probes: Mapping[Kind, ProbeSpec], pod_dir: Path,
                 publish: Callable[[], None]) -> None:
        self.node = node
        self.pod = pod  # the latest pod object
        self.spec = spec
        self.name: str = spec["name"]
        self.plan = plan
        self.env = dict(env)
        self.probe_specs = dict(probes)
        self.pod_dir = pod_dir
        self.log_file = pod_dir / f"{self.name}.log"
        self.publish = publish
        self.view = status.ContainerView(self.name, spec.get("image", ""), status.waiting("ContainerCreating"))
        self.backoff = RestartBackoff()
        self.proc: Process | None = None
        self.stopping = asyncio.Event()
        self._stopped_with: tuple[float, str] | None = None  # stop()'s grace and reason, once it was called
        self._killing: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------------------ helpers

    def _fields(self, **more: Any) -> dict[str, Any]:
        meta = self.pod()["metadata"]
        return {"fields": {"pod": f"{meta['namespace']}/{meta['name']}", "container": self.name, **more}}

    def _event(self, reason: str, message: str, kind: str = "Normal") -> None:
        self.node.events.emit(self.pod(), self.name, reason, message, kind)

    def _log_line(self, text: str) -> None:
        with self.log_file.open("a") as f:
            f.write(f"pdfleet-sim: {text}\n")

    def _tail_since(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as f:
                f.seek(max(offset, f.seek(0, 2) - 64 * 1024))
                return status.log_tail(f.read().decode(errors="replace"))
        except OSError:
            return ""

    @property
    def policy(self) -> str:
        return str(self.pod()["spec"].get("restartPolicy", "Always"))

    @property
    def pod_ip(self) -> str:
        return str(self.pod()["status"]["podIP"])

    # ---------------------------------------------------------------------------------------- lifecycle

    async def _spawn(self) -> Process:
        if isinstance(self.plan, commands.Launch):
            return await self.node.zygote.spawn(mode="launch", argv=self.plan.args, env=self.env, cwd=self.pod_dir,
                                                log_file=self.log_file)
        if isinstance(self.plan, commands.Module):
            return await self.node.zygote.spawn(mode="module", argv=(self.plan.module, *self.plan.args),
                                                env=self.env, cwd=self.pod_dir, log_file=self.log_file)
        return await self.node.zygote.spawn(mode="exec", argv=self.plan.argv, env=self.env, cwd=self.pod_dir,
                                            log_file=self.log_file)

    async def run(self) -> None:
        while not self.stopping.is_set():
            offset = self.log_file.stat().st_size if self.log_file.exists() else 0
            started_at = time.time()
            try:
                self.proc = await self._spawn()
            except (OSError, ZygoteDied) as e:
                self.view.state = status.terminated(code=128, sig=None, started_at=started_at,
                                                    finished_at=time.time(), reason="StartError", message=str(e))
                self._event("Failed", f"Error: {e}", "Warning")
                exit_status = 128
            else:
                late: asyncio.Task[None] | None = None
                if self._stopped_with is not None:
                    # The pod was stopped while its process was being spawned: stop() found no process to kill,
                    # and this one would otherwise run on, holding the pod's IP and directory from its successor.
                    late = asyncio.create_task(self.kill(*self._stopped_with))
                exit_status = await self._supervise(self.proc, started_at, offset)
                if late is not None:
                    await late
            self.publish()
            if self.stopping.is_set() or not should_restart(self.policy, exit_status):
                return
            await self._back_off()

    async def _supervise(self, proc: Process, started_at: float, log_offset: int) -> int:
        cid = f"{status.CONTAINER_ID_PREFIX}{proc.pid}"
        self.view.container_id = cid
        self.view.state = status.running(started_at)
        self.view.started = Kind.STARTUP not in self.probe_specs
        self.view.ready = self.view.started and Kind.READINESS not in self.probe_specs
        log.info("container started", extra=self._fields(pid=proc.pid, run=_describe(self.plan, self.spec)))
        self._event("Started", f"Started container {self.name}")
        self.publish()
        probing = asyncio.create_task(self._probe_all(started_at))
        try:
            exit_ = await proc.wait()
        finally:
            probing.cancel()
            await asyncio.gather(probing, return_exceptions=True)
        proc.signal_group(signal.SIGKILL)  # what is left of the container goes with it, as with a cgroup
        code = status.exit_code(exit_.code, exit_.signal)
        message = self._tail_since(log_offset) if code != 0 else ""
        self.view.state = status.terminated(code=exit_.code, sig=exit_.signal, started_at=started_at,
                                            finished_at=time.time(), message=message, container_id=cid)
        self.view.ready = self.view.started = False
        log.info("container exited", extra=self._fields(pid=proc.pid, exit_code=code, signal=exit_.signal))
        return code

    async def _back_off(self) -> None:
        now = time.time()
        wait = self.backoff.wait_s(now)
        last = self.view.state
        if wait > 0:
            meta = self.pod()["metadata"]
            message = (f"back-off {self.backoff.delay_s:.0f}s restarting failed container={self.name} "
                       f"pod={meta['name']}_{meta['namespace']}({meta['uid']})")
            self.view.state = status.waiting("CrashLoopBackOff", message)
            self.view.last_state = last
            self._event("BackOff", "Back-off restarting failed container", "Warning")
            log.info("back-off before restart", extra=self._fields(wait_s=round(wait, 1)))
            self.publish()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), wait)
            if self.stopping.is_set():
                return
        self.backoff.restarted(time.time())
        self.view.last_state = last
        self.view.restart_count += 1

    # ------------------------------------------------------------------------------------------- probes

    async def _probe_all(self, started_at: float) -> None:
        states = {kind: ProbeState(spec) for kind, spec in self.probe_specs.items()}
        started = asyncio.Event()
        if Kind.STARTUP not in states:
            started.set()
        trigger = asyncio.Event()  # kubelet probes readiness at once when the container has started
        await asyncio.gather(*(self._probe_loop(state, started_at, started, trigger) for state in states.values()))

    async def _probe_loop(self, state: ProbeState, started_at: float, started: asyncio.Event,
                          trigger: asyncio.Event) -> None:
        spec = state.spec
        if spec.kind is not Kind.STARTUP:
            await started.wait()
        await asyncio.sleep(max(0.0, started_at + spec.initial_delay_s - time.time()))
        while True:
            ok, detail = await prober.run(self.node.probe_session, spec.action, self.pod_ip, spec.timeout_s)
            changed = state.observe(ok)
            if not ok and (spec.kind is not Kind.READINESS or changed):
                self._event("Unhealthy", f"{spec.kind.capitalize()} probe failed: {detail}", "Warning")
            if changed:
                log.info("probe result changed", extra=self._fields(probe=str(spec.kind), result=state.result.value,
                                                                    detail=detail))
                self._on_result(spec.kind, state.result, started, trigger)
            if spec.kind is Kind.STARTUP and state.result is Result.SUCCESS:
                return  # a startup probe stops once it has succeeded
            if state.result is Result.FAILURE and spec.kind is not Kind.READINESS:
                return  # the container is being killed
            trigger.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(trigger.wait(), spec.period_s)

    def _on_result(self, kind: Kind, result: Result, started: asyncio.Event, trigger: asyncio.Event) -> None:
        if kind is Kind.STARTUP and result is Result.SUCCESS:
            self.view.started = True
            self.view.ready = Kind.READINESS not in self.probe_specs
            started.set()
            trigger.set()
        elif kind is Kind.READINESS:
            self.view.ready = result is Result.SUCCESS
        elif result is Result.FAILURE:  # startup or liveness
            self._event("Killing", f"Container {self.name} failed {kind} probe, will be restarted")
            self._killing = asyncio.create_task(self.kill(self.grace_s(), f"failed {kind} probe"))
        self.publish()

    # ---------------------------------------------------------------------------------------- stopping

    def grace_s(self) -> float:
        pod = self.pod()
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        return float(grace)

    async def stop(self, grace_s: float, why: str) -> None:
        """The pod goes away: no more restarts, and the running process is killed within `grace_s` (one still
        being spawned is killed as soon as it exists: `run`)."""
        self._stopped_with = (grace_s, why)
        self.stopping.set()
        await self.kill(grace_s, why)

    async def kill(self, grace_s: float, why: str) -> None:
        proc = self.proc
        if proc is None or proc.exited.done():
            return
        deadline = time.monotonic() + grace_s
        log.info("killing container", extra=self._fields(pid=proc.pid, grace_s=grace_s, why=why))
        await self._pre_stop(deadline)
        proc.signal_group(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            log.info("grace period over: SIGKILL", extra=self._fields(pid=proc.pid))
            proc.signal_group(signal.SIGKILL)
            await proc.wait()

    async def _pre_stop(self, deadline: float) -> None:
        hook = (self.spec.get("lifecycle") or {}).get("preStop") or {}
        command = (hook.get("exec") or {}).get("command")
        if not command:
            return
        argv = commands.map_python(command, self.node.python)
        self._log_line(f"preStop: {' '.join(argv)}")
        started = time.monotonic()
        try:
            hook_proc = await self.node.zygote.spawn(mode="exec", argv=argv, env=self.env, cwd=self.pod_dir,
                                                     log_file=self.log_file)
        except (OSError, ZygoteDied) as e:
            self._event("FailedPreStopHook", f"PreStopHook failed: {e}", "Warning")
            return
        try:
            result: Exit = await asyncio.wait_for(hook_proc.wait(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            hook_proc.signal_group(signal.SIGKILL)
            self._event("FailedPreStopHook", "PreStopHook did not finish within the grace period", "Warning")
            return
        log.info("preStop hook done", extra=self._fields(exit_code=status.exit_code(result.code, result.signal),
                                                         seconds=round(time.monotonic() - started, 2)))
        if status.exit_code(result.code, result.signal) != 0:
            self._event("FailedPreStopHook", f"PreStopHook exited {status.exit_code(result.code, result.signal)}",
                        "Warning")


def _describe(plan: commands.Plan, spec: Body) -> str:
    """What runs, as the pod spec writes it: $(VAR) unexpanded, so a value taken from a Secret is never logged."""
    written = " ".join(str(a) for a in [*(spec.get("command") or []), *(spec.get("args") or [])])
    if isinstance(plan, commands.Launch | commands.Module):
        return "zygote fork: " + written[:200]
    return written[:200]
