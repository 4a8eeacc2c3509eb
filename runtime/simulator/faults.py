"""Faults on demand: which one is asked for, read from the pod's annotations (live) and the environment.

Annotations (`$PDFLEET_PODINFO/annotations`, the downward-API file: `key="value"` lines, Go-quoted values,
rewritten atomically on change) are polled every 200 ms; the environment is read once, at start. An
annotation wins over the environment while it is present.

    sim.pdfleet.dev/fault              PDFLEET_SIM_FAULT               desync | hang | dead-rank | slow |
                                                                        wrong-event-loop | wrong-server-args
                                                                        | leak-stripped-markers | leak-parser-off
                                                                        | leak-wrong-version-markers
                                                                        | leak-malformed-call | truncated-call
                                                                        | failing
                                                                        | slow-requests | crash
                                                                        | token-divergence
                                                                        (env only: crash-at-start)
    sim.pdfleet.dev/fault-rank         PDFLEET_SIM_FAULT_RANK          local rank index (default: the last)
    sim.pdfleet.dev/forward-delay-ms   PDFLEET_SIM_FORWARD_DELAY_MS    a forward's duration under `slow`
    sim.pdfleet.dev/stall-ms           PDFLEET_SIM_STALL_MS            how long `straggle` holds its rank
    sim.pdfleet.dev/fail-share         PDFLEET_SIM_FAIL_SHARE          the share of requests `failing` answers
                                                                        with a 500 (default 0.5)
    sim.pdfleet.dev/latency-factor     PDFLEET_SIM_LATENCY_FACTOR      how much slower `slow-requests` makes
                                                                        time to first token and each next token
                                                                        (default 3)
    sim.pdfleet.dev/fault-after-s      PDFLEET_SIM_FAULT_AFTER_S       the fault starts only this long after the
                                                                        engine started (default 0)
    sim.pdfleet.dev/fault-after-requests PDFLEET_SIM_FAULT_AFTER_REQUESTS  ... and only once it has been sent
                                                                        this many requests (default 0)

The last three make a bad revision of the kind that passes a rollout's first checks and breaks once it serves:
`PDFLEET_SIM_FAULT=desync PDFLEET_SIM_FAULT_AFTER_S=20` in `spec.engine.env` is a revision whose ranks diverge
20 s after each engine starts; `failing` answers a share of requests with a 500 (deterministically: the k-th
request fails when floor(k * share) moves); `slow-requests` multiplies the prefill's time and each decode
step's; `crash` ends the engine process with a non-zero exit, as a fatal error in SGLang does.

token-divergence: the fault rank samples another token than its peers in a forward step, as a non-deterministic
kernel can make it. On an engine whose SGLang agrees its sampled tokens across TP ranks (SYNC_TOKEN_IDS_ACROSS_TP,
which the operator sets on every group of more than one rank), the sampler's all-reduce takes the group's token
and nothing follows. On one that does not, that rank's stop check, then its batch, differ from its peers' from the
next iteration on: its ranks read as a desync, latched (SGLang's own sampler shows both, on real gloo ranks, in
tests/unit/test_token_agreement.py).

straggle is one stall of one rank in its own code (default 5 s) while its peers wait for it in the KV-poll
collective: past desyncAfter it reads as a Desync, then the rank catches up and the group recovers. Each
new value of the annotations (another stall-ms, say) asks for one more stall.

desync, hang and dead-rank are latched by the ranks: taking the annotation away does not heal an engine,
as in production. slow, wrong-event-loop and wrong-server-args follow the annotation both ways.

The leak-* faults make tool calls come back as DSML markup in `content`, each as one known cause does in SGLang
(`simulator/toolcalls.py`); they follow the annotation both ways and only touch chat requests with tools.
truncated-call returns a call cut by the request's max_tokens with its broken arguments, as SGLang 0.5.23 alone
does on V4's recipe route; it touches only tool requests whose max_tokens ends inside the call.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pdfleet.runtime.simulator.config import number

log = logging.getLogger(__name__)

PODINFO_ENV = "PDFLEET_PODINFO"
ANNOTATION_PREFIX = "sim.pdfleet.dev/"
ENV_FAULT = "PDFLEET_SIM_FAULT"
ENV_FAULT_RANK = "PDFLEET_SIM_FAULT_RANK"
ENV_FORWARD_DELAY_MS = "PDFLEET_SIM_FORWARD_DELAY_MS"
ENV_STALL_MS = "PDFLEET_SIM_STALL_MS"
POLL_S = 0.2
DEFAULT_SLOW_MS = 1000
DEFAULT_STALL_MS = 5000
DEFAULT_FAIL_SHARE = 0.5
DEFAULT_LATENCY_FACTOR = 3.0


class Fault(enum.IntEnum):
    """Numbered: the ranks read the current fault from one shared integer."""

    NONE = 0
    DESYNC = 1
    HANG = 2
    DEAD_RANK = 3
    SLOW = 4
    WRONG_EVENT_LOOP = 5
    WRONG_SERVER_ARGS = 6
    CRASH_AT_START = 7
    STRAGGLE = 8
    LEAK_STRIPPED_MARKERS = 9
    LEAK_PARSER_OFF = 10
    LEAK_WRONG_VERSION_MARKERS = 11
    LEAK_MALFORMED_CALL = 12
    FAILING = 13
    SLOW_REQUESTS = 14
    CRASH = 15
    TRUNCATED_CALL = 16
    TOKEN_DIVERGENCE = 17

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, text: str) -> Fault:
        """The fault a label names; '' is NONE. Raises ValueError for an unknown name."""
        text = text.strip().lower()
        if not text or text == "none":
            return cls.NONE
        for f in cls:
            if f.label == text:
                return f
        raise ValueError(f"unknown simulator fault {text!r}; known: {', '.join(f.label for f in cls if f)}")


@dataclasses.dataclass(frozen=True)
class Asked:
    """The fault asked for now. `rank` is a local rank index, None for the default (the last)."""

    fault: Fault = Fault.NONE
    rank: int | None = None
    forward_delay_ms: int = DEFAULT_SLOW_MS
    stall_ms: int = DEFAULT_STALL_MS
    fail_share: float = DEFAULT_FAIL_SHARE
    latency_factor: float = DEFAULT_LATENCY_FACTOR
    after_s: float = 0.0
    after_requests: int = 0

    @property
    def delayed(self) -> bool:
        return self.fault is not Fault.NONE and (self.after_s > 0 or self.after_requests > 0)


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"',
            "'": "'"}
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)")


def _unquote_go(quoted: str) -> str:
    """A Go `strconv.Quote`d string's value (what kubelet writes in a downward-API file)."""
    if len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
        return quoted

    def one(m: re.Match[str]) -> str:
        esc = m.group(1)
        if esc[0] in "xuU":
            return chr(int(esc[1:], 16))
        if esc[0].isdigit():
            return chr(int(esc, 8))
        return _ESCAPES.get(esc, esc)

    return _ESCAPE.sub(one, quoted[1:-1])


def parse_annotations(text: str) -> dict[str, str]:
    """The `key="value"` lines of a downward-API annotations file."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = _unquote_go(value.strip())
    return out


def asked(values: Mapping[str, str], key: Callable[[str], str]) -> Asked | None:
    """The fault `values` ask for (None when they name none), each setting's name spelled by `key` (`fault`,
    `fault-rank`, ...). Raises ValueError for a bad value."""
    if key("fault") not in values:
        return None
    rank = values.get(key("fault-rank"), "").strip()
    return Asked(Fault.parse(values[key("fault")]), int(rank) if rank else None,
                 int(number(values, key("forward-delay-ms"), DEFAULT_SLOW_MS)),
                 int(number(values, key("stall-ms"), DEFAULT_STALL_MS)),
                 number(values, key("fail-share"), DEFAULT_FAIL_SHARE, high=1.0),
                 number(values, key("latency-factor"), DEFAULT_LATENCY_FACTOR, low=1.0),
                 number(values, key("fault-after-s"), 0.0),
                 int(number(values, key("fault-after-requests"), 0)))


def env_key(name: str) -> str:
    return "PDFLEET_SIM_" + name.upper().replace("-", "_")


def from_env(env: Mapping[str, str]) -> Asked:
    return asked(env, env_key) or Asked()


def from_annotations(values: Mapping[str, str]) -> Asked | None:
    return asked(values, lambda name: ANNOTATION_PREFIX + name)


def due(fault: Asked, *, running_s: float, requests: int) -> bool:
    """Whether a fault asked for with a delay has started: both its conditions hold."""
    return running_s >= fault.after_s and requests >= fault.after_requests


class Watcher:
    """Polls the annotations file from a daemon thread and hands every change to `apply`; a fault asked for with
    a delay is handed over as no fault until it is due (`requests` counts the requests the engine was sent)."""

    def __init__(self, env: Mapping[str, str], apply: Callable[[Asked], None],
                 requests: Callable[[], int] = lambda: 0, clock: Callable[[], float] = time.monotonic) -> None:
        self._base = from_env(env)
        self._requests = requests
        self._clock = clock
        self._started = clock()
        podinfo = env.get(PODINFO_ENV)
        self._path = Path(podinfo) / "annotations" if podinfo else None
        self._apply = apply
        self._stop = threading.Event()
        self._last: Asked | None = None
        self._last_error = ""

    @property
    def initial(self) -> Asked:
        return self._base

    def poll_once(self) -> Asked:
        current = self._base
        if self._path is not None:
            try:
                found = from_annotations(parse_annotations(self._path.read_text()))
                if found is not None:
                    current = found
                self._last_error = ""
            except FileNotFoundError:
                pass
            except (OSError, ValueError) as e:  # keep the previous state; say so once
                if str(e) != self._last_error:
                    log.warning("simulator: ignoring %s: %s", self._path, e)
                    self._last_error = str(e)
                return self._last or current
        if current.delayed and not due(current, running_s=self._clock() - self._started,
                                       requests=self._requests()):
            current = Asked()  # not yet: the engine serves as a good one until then
        if current != self._last:
            if current.fault is not Fault.NONE or self._last is not None:
                log.warning("simulator: fault now %s (rank %s)", current.fault.label, current.rank)
            self._last = current
            self._apply(current)
        return current

    def start(self) -> Watcher:
        self.poll_once()
        threading.Thread(target=self._run, name="pdfleet-sim-faults", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll_once()

