"""Counting leaks (`pdfleet_toolcall_leaks_total{cause,action}`) and logging a sample at most once a minute.

The counter lives in SGLang's process and registry: created on first use, after SGLang has set up
`PROMETHEUS_MULTIPROC_DIR` (prometheus_client picks its storage when a metric is created), so SGLang's own
`/metrics` (with `--enable-metrics`) exposes it. Without prometheus_client, leaks are still counted here.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from pdfleet.runtime.toolcalls.stream import Leak

logger = logging.getLogger("pdfleet.toolcalls")

METRIC = "pdfleet_toolcall_leaks"  # exposed as pdfleet_toolcall_leaks_total
HELP = ("DeepSeek DSML tool-call markup found in assistant content, and tool calls cut short or with arguments that "
        "are not JSON, by cause and by what the guard did with them.")
SAMPLE_INTERVAL_S = 60.0

_counter: Any = None


def _prometheus_counter() -> Any:
    global _counter
    if _counter is None:
        try:
            from prometheus_client import Counter
        except ImportError:
            return None
        _counter = Counter(METRIC, HELP, ["cause", "action"])
    return _counter


class Reporter:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic, interval_s: float = SAMPLE_INTERVAL_S,
                 prometheus: bool = True) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._clock = clock
        self._interval = interval_s
        self._last_sample: float | None = None
        self._prometheus = _prometheus_counter() if prometheus else None

    def record(self, leaks: Iterable[Leak], request_id: str) -> None:
        for leak in leaks:
            self.counts[(leak.cause.value, leak.action)] += 1
            if self._prometheus is not None:
                self._prometheus.labels(cause=leak.cause.value, action=leak.action).inc()
            now = self._clock()
            if self._last_sample is None or now - self._last_sample >= self._interval:
                self._last_sample = now
                logger.warning("tool-call markup in content of request %s: cause %s, %s; sample: %r "
                               "(one sample a minute; all are counted in %s_total)",
                               request_id, leak.cause.value, leak.action, leak.sample, METRIC)
