"""The pools-by-phase and groups-by-verdict gauges follow every pool's last status, and one pool's change moves
only its own counts (rebuilding both gauges from all pools at each change was O(pools), and showed in the
100-pool benchmark's profile)."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.operator import metrics
from pdfleet.operator.cache import Cache
from pdfleet.operator.controller import Controller
from tests.support.fake_kube import FakeKube


def status(phase: str, *verdicts: tuple[str, str]) -> dict[str, Any]:
    return {"phase": phase, "groups": [{"role": role, "verdict": verdict} for role, verdict in verdicts]}


def pools(phase: str) -> float | None:
    return metrics.REGISTRY.get_sample_value("pdfleet_pools", {"phase": phase})


def groups(role: str, verdict: str) -> float | None:
    return metrics.REGISTRY.get_sample_value("pdfleet_engine_groups", {"role": role, "verdict": verdict})


def test_the_gauges_count_every_pools_last_status_and_one_change_moves_only_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    controller = Controller(client=FakeKube(), cache=Cache(pools={}, owned=[]))
    metrics.POOLS.clear()
    metrics.ENGINE_GROUPS.clear()
    for n in range(100):
        controller._record_summary(("ns", f"p{n}"), status("Ready", ("prefill", "Healthy"), ("decode", "Healthy")))
    assert pools("Ready") == 100 and groups("decode", "Healthy") == 100

    set_labels: list[tuple[str, ...]] = []
    for gauge in (metrics.POOLS, metrics.ENGINE_GROUPS):
        labelled = gauge.labels
        monkeypatch.setattr(gauge, "labels", lambda *labels, _f=labelled: set_labels.append(labels) or _f(*labels))
        monkeypatch.setattr(gauge, "clear", lambda: pytest.fail("a pool's change rebuilt the gauges of all"))
    controller._record_summary(("ns", "p7"), status("Degraded", ("prefill", "Healthy"), ("decode", "Desync")))
    assert pools("Ready") == 99 and pools("Degraded") == 1
    assert groups("decode", "Healthy") == 99 and groups("decode", "Desync") == 1 and groups("prefill", "Healthy") == 100
    assert len(set_labels) <= 5, set_labels  # the label sets that moved, not 100 pools' worth

    controller.forget(("ns", "p7"))  # gone: a label set no pool has any more is removed, not left at 0
    assert pools("Degraded") is None and groups("decode", "Desync") is None
    assert pools("Ready") == 99 and groups("prefill", "Healthy") == 99


def missing(reason: str) -> float | None:
    return metrics.REGISTRY.get_sample_value("pdfleet_pools_without_recommended_patches", {"reason": reason})


def test_pools_that_run_without_recommended_fixes_are_counted_by_why() -> None:
    controller = Controller(client=FakeKube(), cache=Cache(pools={}, owned=[]))
    ready = status("Ready", ("decode", "Healthy"))
    controller._record_summary(("ns", "defaults"), ready | {"patches": {"effective": ["abort-consensus"]}})
    controller._record_summary(("ns", "explicit"), ready | {"patches": {"optedOut": ["abort-consensus"]}})
    controller._record_summary(("ns", "upgraded"), ready | {"patches": {"held": ["grammar-consensus"]}})
    controller._record_summary(("ns", "legacy"), ready)  # a status written before patch policies
    assert (missing("optedOut"), missing("held")) == (1, 1)
    assert pools("Ready") == 4

    # The held fixes rolled out with the pool's next change: it no longer counts; nor does a pool that is gone.
    controller._record_summary(("ns", "upgraded"), ready | {"patches": {"held": []}})
    controller.forget(("ns", "explicit"))
    assert missing("held") is None and missing("optedOut") is None
