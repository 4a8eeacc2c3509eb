"""Every series the chart's Grafana dashboard queries is in a running operator's scrape, and the pool panels have
data once a pool is Ready."""

from __future__ import annotations

import pytest

from tests.support import dashboard, fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

POOL = "tiny"


def test_every_dashboard_query_names_a_series_the_running_operator_offers(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    # A Ready pool first, so that the labelled families the pool panels read have samples, not only a # TYPE.
    fleet.apply_pool(cluster, namespace, POOL, base="minimal", router={"replicas": 0}, transfer={"backend": "fake"})
    fleet.wait_ready(cluster, namespace, POOL)
    wait_for("the Ready pool in pdfleet_pools", lambda: operator.metric("pdfleet_pools", phase="Ready") >= 1,
             timeout=30)
    scrape = operator.metrics()
    offered = dashboard.offered_series(scrape)

    board = dashboard.load()
    queried = {name for expr in dashboard.expressions(board) for name in dashboard.metric_names(expr)}
    queried |= {metric for metric, _ in dashboard.variable_queries(board)}
    assert queried - offered == set(), f"the operator offers {sorted(n for n in offered if n.startswith('pdfleet'))}"

    sampled = {line.split("{")[0].split()[0] for line in scrape.splitlines() if line and not line.startswith("#")}
    with_data = {"pdfleet_pools", "pdfleet_engine_groups", "pdfleet_reconcile_total",
                 "pdfleet_reconcile_duration_seconds_bucket", "pdfleet_kube_requests_total"}
    assert with_data - sampled == set()
