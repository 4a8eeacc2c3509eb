"""kubelet's probe semantics, pure: what a probe is (from the container spec) and what a run of results means.

A probe's result only flips after `failureThreshold` failures or `successThreshold` successes in a row. The
results start as kubelet starts them: readiness Failure (not ready until proven), liveness Success, startup
Unknown. Until a startup probe succeeds, readiness and liveness do not run; a startup probe that fails
`failureThreshold` times, or a liveness probe that does, gets the container killed.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any


class Kind(enum.StrEnum):
    STARTUP = "startup"
    READINESS = "readiness"
    LIVENESS = "liveness"


class Result(enum.Enum):
    UNKNOWN = "unknown"
    SUCCESS = "success"
    FAILURE = "failure"


INITIAL = {Kind.STARTUP: Result.UNKNOWN, Kind.READINESS: Result.FAILURE, Kind.LIVENESS: Result.SUCCESS}


class UnsupportedProbe(ValueError):
    """A probe the runner cannot run (exec, grpc, https): the pod is refused with this message."""


@dataclasses.dataclass(frozen=True)
class Action:
    """What one probe run does: an HTTP GET or a TCP connect against the pod's IP."""

    kind: str  # "http" or "tcp"
    port: int
    path: str = "/"
    host: str | None = None  # None: the pod's IP
    headers: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class ProbeSpec:
    kind: Kind
    action: Action
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    timeout_s: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise UnsupportedProbe(f"the probe names port {port!r}, which the container does not declare")


def _action(probe: Mapping[str, Any], container: Mapping[str, Any]) -> Action:
    if "httpGet" in probe:
        get = probe["httpGet"]
        if str(get.get("scheme", "HTTP")).upper() != "HTTP":
            raise UnsupportedProbe("httpGet probes with scheme HTTPS are not emulated")
        headers = tuple((h["name"], h["value"]) for h in get.get("httpHeaders") or [])
        return Action("http", resolve_port(get["port"], container), get.get("path") or "/", get.get("host"), headers)
    if "tcpSocket" in probe:
        sock = probe["tcpSocket"]
        return Action("tcp", resolve_port(sock["port"], container), host=sock.get("host"))
    kinds = ", ".join(k for k in ("exec", "grpc") if k in probe) or "this"
    raise UnsupportedProbe(f"{kinds} probes are not emulated (only httpGet and tcpSocket)")


def parse(container: Mapping[str, Any]) -> dict[Kind, ProbeSpec]:
    """The container's probes, with Kubernetes' defaults."""
    out: dict[Kind, ProbeSpec] = {}
    for kind in Kind:
        probe = container.get(f"{kind}Probe")
        if not probe:
            continue
        success = int(probe.get("successThreshold") or 1)
        if kind is not Kind.READINESS:
            success = 1  # the API requires 1 for startup and liveness
        out[kind] = ProbeSpec(
            kind=kind, action=_action(probe, container),
            initial_delay_s=float(probe.get("initialDelaySeconds") or 0),
            period_s=float(probe.get("periodSeconds") or 10),
            timeout_s=float(probe.get("timeoutSeconds") or 1),
            success_threshold=success,
            failure_threshold=int(probe.get("failureThreshold") or 3),
        )
    return out


@dataclasses.dataclass
class ProbeState:
    """Consecutive results of one probe and the result they add up to."""

    spec: ProbeSpec
    result: Result = dataclasses.field(init=False)
    successes: int = 0
    failures: int = 0

    def __post_init__(self) -> None:
        self.result = INITIAL[self.spec.kind]

    def observe(self, ok: bool) -> bool:
        """Counts one probe outcome; True when the result changed."""
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= self.spec.success_threshold and self.result is not Result.SUCCESS:
                self.result = Result.SUCCESS
                return True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= self.spec.failure_threshold and self.result is not Result.FAILURE:
                self.result = Result.FAILURE
                return True
        return False

    def reset(self) -> None:
        """A container restart starts every probe over."""
        self.result, self.successes, self.failures = INITIAL[self.spec.kind], 0, 0


def http_success(status: int) -> bool:
    """kubelet counts 200-399 as success (a redirect is not followed off the pod, and counts as success)."""
    return 200 <= status < 400
