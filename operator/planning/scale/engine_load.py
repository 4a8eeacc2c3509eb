"""An engine's load as its /metrics shows it, for `spec.autoscaling`. Pure.

SGLang 0.5.23 publishes per engine (metrics_collector.py) the gauges `sglang:num_queue_reqs` (requests waiting),
`sglang:num_running_reqs` and `sglang:token_usage` (the share of KV cache in use), each labelled by the engine
(and, with DP attention, by dp rank, so they are summed over label sets, then usage averaged over them), and
the histograms `sglang:time_to_first_token_seconds` and `sglang:inter_token_latency_seconds`. A histogram's
`_sum` and `_count` only grow, so the latency over the time between two polls is their growth's quotient: a rate
over the window, not the engine's lifetime mean.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

_GAUGES = {"sglang:num_queue_reqs": "queue", "sglang:num_running_reqs": "running",
           "sglang:token_usage": "token_usage"}
_COUNTERS = {
    "sglang:time_to_first_token_seconds_sum": "ttft_sum",
    "sglang:time_to_first_token_seconds_count": "ttft_count",
    "sglang:inter_token_latency_seconds_sum": "itl_sum",
    "sglang:inter_token_latency_seconds_count": "itl_count",
}
_AVERAGED = ("token_usage",)  # a share per dp rank: their mean is the engine's, their sum would pass 1


@dataclasses.dataclass(frozen=True)
class EngineLoad:
    """One engine's load for one decision: the gauges now, the latency counters' growth since the last poll."""

    queue: float = 0.0
    running: float = 0.0
    token_usage: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    itl_sum: float = 0.0
    itl_count: float = 0.0


@dataclasses.dataclass(frozen=True)
class LoadSample(EngineLoad):
    """One engine's gauges and latency counters (their lifetime totals) at one poll, by pod uid."""

    pod: str = ""


def parse(pod: str, text: str) -> LoadSample | None:
    """The engine's load from its /metrics text; None when the text does not parse or declares none of the gauges
    (not an SGLang engine, or one started without --enable-metrics)."""
    totals: dict[str, float] = {}
    seen: dict[str, int] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                field = _GAUGES.get(s.name) or _COUNTERS.get(s.name)
                if field is not None:
                    totals[field] = totals.get(field, 0.0) + max(0.0, float(s.value))
                    seen[field] = seen.get(field, 0) + 1
    except (ValueError, TypeError):
        return None
    if not any(name in totals for name in _GAUGES.values()):
        return None
    for field in _AVERAGED:
        if seen.get(field):
            totals[field] /= seen[field]
    return LoadSample(pod=pod, **totals)


def window(previous: LoadSample | None, now: LoadSample) -> EngineLoad:
    """`now`'s gauges with the latency counters' growth since `previous` (none without one, or when they went
    down: the engine restarted in between, and its new counters' lifetime is not the window)."""
    grown = {"ttft_sum": 0.0, "ttft_count": 0.0, "itl_sum": 0.0, "itl_count": 0.0}
    if previous is not None and previous.pod == now.pod:
        for prefix in ("ttft", "itl"):
            d_sum = getattr(now, f"{prefix}_sum") - getattr(previous, f"{prefix}_sum")
            d_count = getattr(now, f"{prefix}_count") - getattr(previous, f"{prefix}_count")
            if d_sum >= 0 and d_count >= 0:
                grown[f"{prefix}_sum"], grown[f"{prefix}_count"] = d_sum, d_count
    return EngineLoad(queue=now.queue, running=now.running, token_usage=now.token_usage, **grown)


@dataclasses.dataclass(frozen=True)
class Work:
    """What the last health poll read of a pool's groups' load, for a scale-down's choice of group
    (`ordinals`): each group's leader's load, by group name, and the groups whose leader was asked, whether it
    answered or not (a leader without /metrics is asked and has no load: the choice does not wait for it)."""

    loads: Mapping[str, EngineLoad] = dataclasses.field(default_factory=dict)
    asked: frozenset[str] = frozenset()
