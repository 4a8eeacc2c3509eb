"""examples/gang/ as a user applies it, dry run on the local cluster: Kueue's objects through Kueue's own webhooks
(hack/kueue.py runs the real Kueue) and the pool through the generated CRD, both with kubectl's strict field
validation, so a misspelt or unknown field fails here. What the pool asks of the queues is checked without a
cluster (tests/unit/test_gang_example.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.operator.api import crd, meta
from tests.support.cluster import Cluster

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
GANG = ROOT / "examples" / "gang"


def test_kueue_and_the_crd_accept_the_gang_example_as_written(cluster: Cluster, kueue: None) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=pdfleet-tests",
                    "-f", str(ROOT / crd.DEFAULT_OUTPUT))
    cluster.wait_established(meta.CRD_NAME)
    for name in ("kueue-queues.yaml", "multinode-gang.yaml"):
        out = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", str(GANG / name)).stdout
        assert "(server dry run)" in out and out.count("\n") == (4 if name.startswith("kueue") else 1), out
