"""operator/kopf_watch.py against the operator's own kopf registry and kopf's own revision of what it watches
(kopf._core.reactor.observation.revise_resources, fed the resources a discovery would list): the operator is
ready only while kopf watches every kind its handlers need, and not alive once one has been unwatched for the
deadline; a later revision that watches them all (kopf's answer to a CRD created) makes it both again."""

from __future__ import annotations

import kopf
import pytest
from kopf._cogs.structs import references
from kopf._core.reactor import observation

from pdfleet.operator import (
    handlers,  # noqa: F401  (registers the operator's handlers)
    kopf_watch,
)

REGISTRY = kopf.get_default_registry()
SELECTORS = kopf_watch.watched_selectors(REGISTRY)


def _served(*, without_group: str | None = None) -> list[references.Resource]:
    """One served resource for each kind the operator's handlers select, as kopf's discovery scan lists them."""
    return [references.Resource(group=s.group or "", version=s.version or "v1", plural=str(s.plural or s.any_name),
                                namespaced=True, preferred=True, verbs=("list", "watch", "patch", "get"))
            for s in SELECTORS if s.group != without_group]


def _coverage(resources: list[references.Resource], *, discovered: bool = True) -> kopf_watch.WatchCoverage:
    insights = references.Insights()
    observation.revise_resources(resources=resources, insights=insights, registry=REGISTRY, group=None)
    if discovered:
        insights.ready_resources.set()
    return kopf_watch.WatchCoverage(insights, SELECTORS, deadline=120, _since=0.0)


def test_the_operator_selects_its_own_kinds_and_the_ones_it_owns() -> None:
    names = {kopf_watch.kind_name(s) for s in SELECTORS}
    assert {"inferencepools.pdfleet.dev", "inferencepoolroles.pdfleet.dev", "pods", "deployments.apps",
            "networkpolicies.networking.k8s.io"} <= names


def test_ready_and_alive_when_kopf_watches_every_kind() -> None:
    coverage = _coverage(_served())
    assert coverage.missing(now=1.0) is None
    assert coverage.dead(now=1000.0) is None


def test_not_ready_before_kopfs_first_discovery_has_ended() -> None:
    coverage = _coverage(_served(), discovered=False)
    assert "not finished its first discovery" in (coverage.missing(now=1.0) or "")


def test_a_group_the_discovery_did_not_serve_is_named_and_kills_liveness_only_after_the_deadline(
        caplog: pytest.LogCaptureFixture) -> None:
    coverage = _coverage(_served(without_group="pdfleet.dev"))
    why = coverage.missing(now=10.0)
    assert why is not None
    assert "inferencepools.pdfleet.dev" in why and "inferencepoolroles.pdfleet.dev" in why and "pods" not in why
    assert coverage.dead(now=119.0) is None
    with caplog.at_level("ERROR", logger="pdfleet.operator.kopf_watch"):
        dead = coverage.dead(now=121.0)
        assert coverage.dead(now=130.0) is not None
    assert dead is not None and "inferencepools.pdfleet.dev" in dead and "121 s" in dead
    assert [r.name for r in caplog.records if r.name.startswith("pdfleet")] == ["pdfleet.operator.kopf_watch"]  # once


def test_a_revision_that_watches_them_all_makes_it_ready_and_alive_again_and_restarts_the_clock() -> None:
    coverage = _coverage(_served(without_group="pdfleet.dev"))
    assert coverage.dead(now=200.0) is not None
    # kopf's answer to a CRD event: the group is scanned again and revised.
    pdfleet = [r for r in _served() if r.group == "pdfleet.dev"]
    observation.revise_resources(resources=pdfleet, insights=coverage.insights, registry=REGISTRY,
                                 group="pdfleet.dev")
    assert coverage.missing(now=201.0) is None
    assert coverage.dead(now=202.0) is None
    # The CRDs deleted later: unwatched again from then, not from the start.
    observation.revise_resources(resources=[], insights=coverage.insights, registry=REGISTRY, group="pdfleet.dev")
    assert coverage.missing(now=300.0) is not None
    assert coverage.dead(now=419.0) is None
    assert coverage.dead(now=421.0) is not None



def test_coverage_holds_new_insights_for_kopf_to_fill_and_the_registry_s_selectors() -> None:
    """What pdfleet-operator hands to kopf.operator(insights=...): kopf fills the insights, the coverage reads them."""
    coverage = kopf_watch.coverage(REGISTRY, deadline=30.0)
    assert isinstance(coverage.insights, references.Insights) and not coverage.insights.watched_resources
    assert coverage.selectors == SELECTORS and coverage.deadline == 30.0
    assert "not finished its first discovery" in (coverage.missing() or "")
    observation.revise_resources(resources=_served(), insights=coverage.insights, registry=REGISTRY, group=None)
    coverage.insights.ready_resources.set()
    assert coverage.missing() is None
