"""What an engine pod carries for Kueue when its role asks for gang scheduling (`scheduling.gang`): the labels
and annotations Kueue v0.17's pod integration reads to make one Workload of a group's pods, and nothing else.
Kueue's own webhook adds its scheduling gates and finalizer; on admission it removes the gates and adds its
flavor's node selector and tolerations. None of that is in the rendered pod, so the applied-hash comparison
(render/stamp.py) never reads it as drift.
"""

from __future__ import annotations

import hashlib

from pdfleet.operator.api.scheduling import EngineScheduling, TopologyMode

# Kueue v0.17.0's names (pkg/controller/constants, pkg/controller/jobs/pod/constants,
# apis/kueue/v1beta2/topology_types.go).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"
# A serving group never finishes: a pod of it that is replaced while its Workload stays admitted rejoins that
# admission (measured, docs/local-fleet.md), where a batch group would finish and give its quota back.
GROUP_SERVING = "kueue.x-k8s.io/pod-group-serving"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
ADMISSION_GATE = "kueue.x-k8s.io/admission"  # the gate Kueue's webhook puts on each pod it will admit
FINALIZER = "kueue.x-k8s.io/managed"  # Kueue's finalizer on the pods it manages
LABEL_VALUE_MAX = 63


def pod_group_name(group: str, revision: str) -> str:
    """Kueue's name for one revision of an engine group: its Workload's name and the pods' group label. A
    rollout replaces a group by pods of the same names; Kueue v0.17 made a new Workload for them even under the
    old name once the old pods were gone (measured, docs/local-fleet.md), and the revision in the name keeps
    each revision's gang its own Workload whatever the order Kueue finalizes the old one in, and says in a
    status which revision waits. A restart keeps the revision and the name. A label value holds 63
    characters; a longer name keeps its start and a hash of the whole (names are unique within a pool)."""
    name = f"{group}-{revision}"
    if len(name) <= LABEL_VALUE_MAX:
        return name
    digest = hashlib.sha256(group.encode()).hexdigest()[:8]
    return f"{group[:LABEL_VALUE_MAX - len(revision) - len(digest) - 2]}-{digest}-{revision}"


def labels(scheduling: EngineScheduling, group: str, revision: str) -> dict[str, str]:
    if scheduling.gang is None:
        return {}
    return {QUEUE_LABEL: scheduling.gang.queue_name, GROUP_LABEL: pod_group_name(group, revision)}


def annotations(scheduling: EngineScheduling, nodes_per_group: int) -> dict[str, str]:
    if scheduling.gang is None:
        return {}
    out = {GROUP_COUNT: str(nodes_per_group), GROUP_SERVING: "true"}
    if scheduling.topology is not None:
        key = REQUIRED_TOPOLOGY if scheduling.topology.mode is TopologyMode.REQUIRED else PREFERRED_TOPOLOGY
        out[key] = scheduling.topology.node_label
    return out
