"""What well-behaved engines answer the verification gates, for planner tests without agents or engines.

`answers(pool, pods)` gives `reconcile.plan`'s `health` and `engines` inputs as the monitor would hand them for
engines that run exactly what they were rendered with: each group whose pods are all Ready reports the expected
event loop on every rank and the patches its pods were started with (`--patch=` in their args), and its leader's
/server_info shows its rendered operator-owned args. A test makes one
group misbehave by passing `loops={group: loop}` or `server_args={group: {field: value}}`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdfleet.operator.api import checks
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.status import Verdict
from pdfleet.operator.planning.groups import pod_ready, pods_by_group
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.rollout import verification
from pdfleet.operator.planning.rollout.verification import EngineFacts
from pdfleet.operator.render import labels
from tests.support.server_args import shown_by

Body = dict[str, Any]


def answers(pool: Body, pods: Sequence[Body], *, loops: Mapping[str, str] | None = None,
            server_args: Mapping[str, Mapping[str, Any]] | None = None
            ) -> tuple[dict[str, GroupHealth], dict[str, EngineFacts]]:
    spec, problems = checks.validate_pool(pool)
    health: dict[str, GroupHealth] = {}
    facts: dict[str, EngineFacts] = {}
    if spec is None or problems:
        return health, facts  # a rejected spec is planned without looking at engines
    for group, members in pods_by_group(list(pods)).items():
        live = [p for p in members if not p["metadata"].get("deletionTimestamp")]
        if not live or not all(pod_ready(p) for p in live):
            continue
        role = Role(live[0]["metadata"]["labels"][labels.ROLE])
        tp = spec.role(role).tp
        loop = (loops or {}).get(group, verification.expected_event_loop(spec, role))
        applied = frozenset(tuple(a.removeprefix("--patch=") for a in p["spec"]["containers"][0].get("args", [])
                                  if a.startswith("--patch=")) for p in live)
        health[group] = GroupHealth(Verdict.HEALTHY, loop, f"all {tp} rank(s) make progress", tp, answered=True,
                                    patch_sets=applied)
        leader = next(p for p in live if p["metadata"]["labels"].get(labels.RANK, "0") == "0")
        info = {**shown_by(leader),
                "host": "127.1.0.5", "dp_size": 1, **(server_args or {}).get(group, {})}
        facts[group] = EngineFacts(pods=frozenset(p["metadata"]["uid"] for p in live),
                                   server_info={leader["metadata"]["uid"]: info})
    return health, facts
