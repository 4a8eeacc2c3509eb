"""The chart's optional Grafana dashboard: a ConfigMap Grafana's sidecar picks up, holding a dashboard whose every
query reads metrics, and labels, that the operator declares.

tests/integration/test_grafana_dashboard.py checks the same names against a running operator's scrape.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase

from pdfleet.operator import metrics
from tests.support import dashboard
from tests.unit.test_chart import RELEASE_NS, documents, of_kind, one, template

ENABLED = {"grafanaDashboard": {"enabled": True}}
# Labels Prometheus adds to every series from its scrape target.
TARGET_LABELS = frozenset({"job", "instance"})


def dashboard_config_map(values: dict[str, Any]) -> dict[str, Any]:
    return one(documents(template(values).stdout), "ConfigMap")


def declared_labels() -> dict[str, frozenset[str]]:
    """Series name -> the labels the operator gives it (histogram buckets also get `le`)."""
    found: dict[str, frozenset[str]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            labels = frozenset(value._labelnames)
            for family in value.describe():
                for series in dashboard.offered_series(f"# TYPE {family.name} {family.type}"):
                    found[series] = labels | ({"le"} if series.endswith("_bucket") else set())
    return found


def test_the_dashboard_is_off_by_default() -> None:
    assert of_kind(documents(template({}).stdout), "ConfigMap") == []


def test_enabled_it_is_a_config_map_with_the_sidecar_label_holding_the_dashboard_file() -> None:
    config_map = dashboard_config_map(ENABLED)
    meta = config_map["metadata"]
    assert (meta["name"], meta["namespace"]) == ("pdfleet-grafana-dashboard", RELEASE_NS)
    assert meta["labels"]["grafana_dashboard"] == "1"
    assert meta["labels"]["app.kubernetes.io/part-of"] == "pdfleet"
    assert "annotations" not in meta
    (key,) = config_map["data"]
    assert key == "pdfleet.json"
    assert json.loads(config_map["data"][key]) == dashboard.load()


def test_its_namespace_labels_and_annotations_are_values() -> None:
    values = {"grafanaDashboard": {"enabled": True, "namespace": "monitoring", "labels": {"team": "inference"},
                                   "annotations": {"grafana_folder": "pdfleet"}}}
    meta = dashboard_config_map(values)["metadata"]
    assert meta["namespace"] == "monitoring"
    assert meta["labels"]["team"] == "inference"
    assert meta["labels"]["grafana_dashboard"] == "1"  # a map value merges with the default
    assert meta["annotations"] == {"grafana_folder": "pdfleet"}


@pytest.mark.parametrize(("values", "message"), [
    ({"grafanaDashboard": {"enabled": True, "labels": {"grafana_dashboard": 1}}},
     "/grafanaDashboard/labels/grafana_dashboard': got number, want string"),
    ({"grafanaDashboard": {"namespace": "Monitoring"}}, "/grafanaDashboard/namespace'"),
    ({"grafanaDashboard": {"enable": True}}, "additional properties 'enable' not allowed"),
])
def test_bad_dashboard_values_are_refused_naming_them(values: dict[str, Any], message: str) -> None:
    result = template(values, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def test_the_dashboard_covers_the_operators_concerns() -> None:
    queried = {name for expr in dashboard.expressions(dashboard.load()) for name in dashboard.metric_names(expr)}
    assert queried >= {"pdfleet_pools", "pdfleet_engine_groups", "pdfleet_group_restarts_total",
                       "pdfleet_evidence_captures_total", "pdfleet_reconcile_duration_seconds_bucket",
                       "pdfleet_reconcile_total", "pdfleet_kube_requests_total",
                       "pdfleet_router_worker_changes_total", "pdfleet_rollout_analysis_total",
                       "pdfleet_rollout_bake_duration_seconds_bucket", "pdfleet_role_scales_total",
                       "pdfleet_autoscaler_desired_groups", "pdfleet_autoscaler_serving_groups",
                       "pdfleet_autoscaler_decisions_total", "pdfleet_autoscaler_metric_value"}


def test_every_query_reads_series_the_operator_declares() -> None:
    offered = dashboard.offered_series(generate_latest(metrics.REGISTRY).decode())
    board = dashboard.load()
    for expr in dashboard.expressions(board):
        assert dashboard.metric_names(expr), f"no metric in {expr!r}"
        assert dashboard.metric_names(expr) <= offered, expr
    for metric, _ in dashboard.variable_queries(board):
        assert metric in offered


def test_every_query_matches_and_groups_only_on_labels_the_series_has() -> None:
    declared = declared_labels()
    for expr in dashboard.expressions(dashboard.load()):
        for name, labels in dashboard.label_names(expr).items():
            assert labels <= declared[name] | TARGET_LABELS, f"{expr!r}: {name} has labels {sorted(declared[name])}"


def test_counters_are_read_as_rates_and_histograms_as_quantiles_of_bucket_rates() -> None:
    for expr in dashboard.expressions(dashboard.load()):
        for name in dashboard.metric_names(expr):
            if name.endswith("_total"):
                assert f"rate({name}" in expr or f"increase({name}" in expr, expr
            if name.endswith("_bucket"):
                assert expr.startswith("histogram_quantile(") and f"rate({name}" in expr, expr


def test_every_panel_queries_the_data_source_variable_and_has_a_unique_id_and_title() -> None:
    board = dashboard.load()
    graphs = [p for p in dashboard.panels(board) if p["type"] != "row"]
    assert len({p["id"] for p in dashboard.panels(board)}) == len(list(dashboard.panels(board)))
    assert len({p["title"] for p in graphs}) == len(graphs)
    for panel in graphs:
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), panel["title"]
