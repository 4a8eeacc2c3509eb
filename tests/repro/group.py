"""The test side of a reproduction run: start it in its own session, watch its ledger, judge it, kill it.

The ledger is read from outside the ranks exactly as the pod's agent reads it (`Ledger.open_readonly`,
`report.build` with process liveness, `report.rank_views`), and judged by `verdict.judge`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from pdfleet.runtime.health import ledger, procs, report, verdict
from tests.repro import scenario as scenario_mod
from tests.support import forkserver
from tests.support.ports import free_port as free_port  # re-exported: the scenarios' rendezvous port

REPO = Path(__file__).resolve().parents[2]


# A reproduction's launcher process.
Launcher = forkserver.Forked
# Starts a reproduction run: (patches, world, **story) -> (its scenario, the launcher process). The `launch`
# fixture of tests/unit/conftest.py is one.
Launch = Callable[..., tuple[scenario_mod.Scenario, Launcher]]

def start(sc: scenario_mod.Scenario, module: str = "tests.repro.decode_loop",
          args: tuple[str, ...] = ()) -> Launcher:
    """The launcher (`module`, given the scenario and `args`), forked from the test process's zygote with SGLang
    already imported, in a new process group: its ranks are its children, so one killpg ends them all."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1")
    return forkserver.shared().spawn(module, (sc.to_json(), *args), env=env, cwd=REPO,
                                     log=Path(sc.workdir) / "launcher.log")


def kill(proc: Launcher) -> None:
    """End the launcher and every rank it forked, whatever state they are in. Idempotent."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def views(path: str, world: int) -> list[verdict.RankView]:
    """The ranks as the agent would serve them now (ABSENT before the ledger or a rank exists)."""
    try:
        led = ledger.Ledger.open_readonly(path)
    except (FileNotFoundError, ledger.LedgerError):
        return report.rank_views([], expected=range(world))
    try:
        recs = led.read_all()
        pod = report.build(recs, now_ns=time.monotonic_ns(), ledger=path,
                           alive=lambda r: procs.is_alive(r.pid, r.pid_start))
    finally:
        led.close()
    return report.rank_views([pod], expected=range(world))


@dataclasses.dataclass(frozen=True)
class Sample:
    """One poll: when (test-process monotonic clock, shared with the ranks on this host) and the verdict."""

    at_ns: int
    verdict: verdict.Verdict


def watch(
    path: str,
    world: int,
    policy: verdict.HealthPolicy,
    *,
    period_s: float,
    until: Callable[[verdict.Verdict], bool],
    deadline_s: float,
) -> list[Sample]:
    """Judge the group every `period_s` on a fixed grid, as the operator's poller would, until `until` holds
    for a verdict or `deadline_s` passes. Returns every sample taken."""
    samples: list[Sample] = []
    start = time.monotonic()
    tick = 0
    while time.monotonic() - start < deadline_s:
        seen = verdict.judge(views(path, world), policy)
        samples.append(Sample(at_ns=time.monotonic_ns(), verdict=seen))
        if until(seen):
            break
        tick += 1
        time.sleep(max(0.0, start + tick * period_s - time.monotonic()))
    return samples


def wait_for(condition: Callable[[], bool], *, timeout_s: float, every_s: float = 0.1) -> bool:
    """True as soon as `condition()` holds; False after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return condition()
