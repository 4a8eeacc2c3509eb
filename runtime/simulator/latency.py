"""SGLang's two request latency histograms, as its tokenizer manager keeps them: time to first token and
inter-token latency, with SGLang 0.5.23's names, help, buckets and labels (TTFT adds `is_streaming`).

A histogram here is counts per bucket, a sum and a count per series, rendered in Prometheus' text format. A
series appears with its first observation, as with prometheus_client's labelled metrics.
"""

from __future__ import annotations

import bisect
import dataclasses

# SGLang's defaults (TokenizerMetricsCollector: bucket_time_to_first_token, bucket_inter_token_latency).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)


@dataclasses.dataclass
class _Series:
    counts: list[int]  # per bucket, not cumulative; the last one is +Inf
    total: float = 0.0
    count: int = 0


class Histogram:
    """`name`'s observations per value of its own labels (`label`, if any, beside the engine's)."""

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...], label: str | None = None) -> None:
        self.name = name
        self.help_text = help_text
        self.bounds = tuple(float(b) for b in buckets)
        self.label = label
        self._series: dict[str, _Series] = {}

    def observe(self, value: float, label_value: str = "") -> None:
        series = self._series.get(label_value)
        if series is None:
            series = self._series[label_value] = _Series([0] * (len(self.bounds) + 1))
        series.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: a value on a bound counts in it
        series.total += value
        series.count += 1

    def render(self, labels: str) -> list[str]:
        """Its lines of Prometheus text, each series labelled `labels` (the engine's) and its own label."""
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        for value, series in sorted(self._series.items()):
            own = f'{labels},{self.label}="{value}"' if self.label else labels
            cumulative = 0
            for bound, n in zip((*self.bounds, float("inf")), series.counts, strict=True):
                cumulative += n
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f'{self.name}_bucket{{{own},le="{le}"}} {float(cumulative)}')
            lines += [f"{self.name}_sum{{{own}}} {series.total!r}", f"{self.name}_count{{{own}}} {float(series.count)}"]
        return lines


def time_to_first_token() -> Histogram:
    return Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                     TTFT_BUCKETS, label="is_streaming")


def inter_token_latency() -> Histogram:
    return Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                     ITL_BUCKETS)


def is_streaming(stream: bool) -> str:
    """The value of TTFT's `is_streaming` label, as SGLang writes it."""
    return "true" if stream else "false"
