"""A role's scales by `spec.autoscaling` as its pool's Events tell them (ScaledUp, ScaledDown), and how far apart
they are against what its behavior allows."""

from __future__ import annotations

import datetime
import itertools
from typing import Any

from tests.support import fleet
from tests.support.cluster import Cluster

Scale = tuple[datetime.datetime, str, str]  # (time, reason, message)


def event_time(event: dict[str, Any]) -> datetime.datetime:
    raw = event.get("eventTime") or event.get("firstTimestamp") or event.get("lastTimestamp")
    return datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))


def own_scales(cluster: Cluster, namespace: str, pool: str, role: str) -> list[Scale]:
    """The role's scales by its own decision (not the band carrying it), oldest first."""
    found = []
    for reason in ("ScaledUp", "ScaledDown"):
        for e in fleet.events(cluster, namespace, pool, reason):
            if e["message"].startswith(f"{role} ") and "(RatioFollow)" not in e["message"].split(":")[0]:
                found.append((event_time(e), reason, e["message"]))
    return sorted(found)


def stabilisation_breaches(scales: list[Scale], *, interval: int, down_window: int) -> list[str]:
    """Pairs of a role's own scales closer than its behavior allows: two scales within minIntervalSeconds, or a
    scale-down within the down window of the scale-up before it (the recommendation that grew the role is in
    that window, and a role shrinks only to the window's largest). One second of slack: Events carry seconds."""
    out = []
    for (t0, r0, m0), (t1, r1, m1) in itertools.pairwise(scales):
        gap = (t1 - t0).total_seconds()
        if gap < interval - 1 or (r0 == "ScaledUp" and r1 == "ScaledDown" and gap < down_window - 1):
            out.append(f"{gap:.0f} s apart: {m0!r} then {m1!r}")
    return out
