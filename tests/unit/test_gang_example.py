"""examples/gang/: the pool asks for what the queues file makes. Its spec passes every check; its queue is the
LocalQueue there, in its namespace; its topology label is a level of the Topology of the flavor the queue's
ClusterQueue hands out; the decode role's GPUs fit that quota. On the local cluster, Kueue's own webhooks and the
CRD accept both files (tests/integration/test_gang_example.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from pdfleet.operator.api import checks
from pdfleet.operator.api.roles import Role

GANG = Path(__file__).resolve().parents[2] / "examples" / "gang"


def _kueue() -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for doc in yaml.safe_load_all((GANG / "kueue-queues.yaml").read_text()):
        out.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    return out


def test_the_gang_pool_passes_every_check_and_asks_for_what_the_queues_file_makes() -> None:
    pool = yaml.safe_load((GANG / "multinode-gang.yaml").read_text())
    spec, problems = checks.validate_pool(pool)
    assert problems == [] and spec is not None
    kueue = _kueue()
    decode = spec.role(Role.DECODE)
    gang, topology = decode.scheduling.gang, decode.scheduling.topology
    assert gang is not None and topology is not None
    local = kueue["LocalQueue"][gang.queue_name]
    assert local["metadata"]["namespace"] == pool["metadata"]["namespace"]
    cluster_queue = kueue["ClusterQueue"][local["spec"]["clusterQueue"]]
    (group,) = cluster_queue["spec"]["resourceGroups"]
    (flavor_quota,) = group["flavors"]
    flavor = kueue["ResourceFlavor"][flavor_quota["name"]]
    levels = [level["nodeLabel"] for level in kueue["Topology"][flavor["spec"]["topologyName"]]["spec"]["levels"]]
    assert topology.node_label in levels
    quota = {r["name"]: int(r["nominalQuota"]) for r in flavor_quota["resources"]}
    gpus = decode.gpus_per_node * decode.nodes_per_group * decode.replicas
    assert gpus <= quota["nvidia.com/gpu"], "the quota must hold the role's groups at once"
