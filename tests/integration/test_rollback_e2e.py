"""End to end on the local cluster: automatic rollback, `pdfleet rollout undo` and `pause`/`resume`, with the
operator and the CLI as people run them (as in `test_verified_rollout_e2e.py` and `test_cli_e2e.py`).

A bad revision is asked for the way `test_verified_rollout_e2e.py` does: `PDFLEET_SIM_FAULT=wrong-event-loop` in
`spec.engine.env` makes the replacing pods' ranks report the other loop, so their eventLoop gate fails.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.test_cli_e2e import pdfleet
from tests.integration.test_rollout_under_load_e2e import client_load
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

POOL = "rollback"
WRONG_LOOP = {"env": [{"name": "PDFLEET_SIM_FAULT", "value": "wrong-event-loop"}]}


def pool(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return fleet.pool(cluster, namespace, POOL)


def settled(cluster: Cluster, namespace: str, revision: str | None = None, *, not_: str | None = None,
            timeout: float = 240) -> dict[str, Any]:
    """The pool once its spec's rollout is verified (at `revision`, or at any but `not_`)."""
    def done() -> dict[str, Any] | None:
        body = pool(cluster, namespace)  # one read: conditions read apart could be newer than the groups
        now = body.get("status") or {}
        verified = fleet.conditions_of(now).get("RolloutVerified") or {}
        ok = verified.get("status") == "True" and now.get("observedGeneration") == body["metadata"]["generation"] \
            and now.get("currentRevision") == now.get("updateRevision") and now.get("currentRevision") not in \
            (None, not_) and revision in (None, now.get("currentRevision"))
        return body if ok else None
    return wait_for(f"the pool verified at {revision or 'a new revision'}", done, timeout=timeout, interval=0.5)


def patch_engine(cluster: Cluster, namespace: str, engine: dict[str, Any]) -> None:
    cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"engine": engine}}))


def annotation(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    raw = (body["metadata"].get("annotations") or {}).get(key)
    return json.loads(raw) if raw else None


def uids(cluster: Cluster, namespace: str) -> set[str]:
    return {p["metadata"]["uid"] for p in fleet.engine_pods(cluster, namespace, POOL)}


def loops_are(cluster: Cluster, namespace: str, expected: set[str]) -> None:
    """Every group's ranks report these loops. Waited for: a poll that cannot tell a group's loop (an agent slow
    to answer on a busy machine) leaves `eventLoop` empty until the next one, while the group stays verified."""
    wait_for(f"every group on {sorted(expected)}", lambda: {
        g.get("eventLoop") for g in pool(cluster, namespace)["status"]["groups"]} == expected, timeout=30,
        interval=0.5)


def test_a_failed_gate_rolls_back_verified_and_undo_pause_resume_work(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={"replicas": 1},
                     rollout={"autoRollback": True})
    first = settled(cluster, namespace)
    good = first["status"]["currentRevision"]
    record = annotation(pool(cluster, namespace), "pdfleet.dev/verified-spec")
    assert record is not None and record["revision"] == good
    nothing = pdfleet(cluster, "rollout", "undo", POOL, "-n", namespace)
    assert nothing.returncode == 1 and "already has the last verified revision" in nothing.stderr, nothing

    # A revision whose decode group fails its gate: stopped (RolloutVerified False, announced), then rolled back.
    patch_engine(cluster, namespace, WRONG_LOOP)
    bad_generation = pool(cluster, namespace)["metadata"]["generation"]
    watched = pdfleet(cluster, "rollout", "status", POOL, "-n", namespace, "--watch", "--timeout", "3m")
    assert watched.returncode == 1, watched.stdout + watched.stderr
    [failed] = wait_for("one RolloutGateFailed", lambda: fleet.events(cluster, namespace, POOL, "RolloutGateFailed"),
                        timeout=60)
    assert f"gate eventLoop failed for decode group {POOL}-decode-0" in failed["message"]
    assert failed["message"].endswith(f"autoRollback: returning to the last verified revision {good}")
    back = settled(cluster, namespace, good)
    assert back["metadata"]["generation"] == bad_generation + 1, "one patch back, not two"
    assert "env" not in back["spec"]["engine"], "the engine-shaping spec is the verified one again"
    loops_are(cluster, namespace, {"event_loop_overlap_disagg_prefill", "event_loop_overlap_disagg_decode"})
    assert all(g["verifiedRevision"] == g["revision"] for g in back["status"]["groups"])
    why = annotation(back, "pdfleet.dev/rolled-back")
    assert why is not None and (why["cause"], why["to_revision"]) == ("GateFailed", good)
    [rolled] = fleet.events(cluster, namespace, POOL, "RolloutRolledBack")
    assert rolled["type"] == "Warning" and rolled["message"].startswith(
        f"rolled back from revision {why['from_revision']} to the last verified revision {good}: gate eventLoop "
        f"failed for decode group {POOL}-decode-0")
    after = pdfleet(cluster, "rollout", "status", POOL, "-n", namespace)
    assert after.returncode == 1 and f"revision {good} is verified again" in after.stdout, after

    # Pause: a new revision starts no replacement; the status and the CLI say Paused. Resume: it rolls out.
    paused = pdfleet(cluster, "rollout", "pause", POOL, "-n", namespace)
    assert paused.returncode == 0 and "paused" in paused.stdout, paused
    before = uids(cluster, namespace)
    patch_engine(cluster, namespace, {"overlapSchedule": "Disabled"})
    generation = pool(cluster, namespace)["metadata"]["generation"]
    progressing = wait_for("Progressing Paused", lambda: (c := fleet.conditions(cluster, namespace, POOL).get(
        "Progressing") or {}).get("reason") == "Paused" and c.get("observedGeneration") == generation and c,
        timeout=60, interval=0.5)
    assert progressing["status"] == "Unknown"
    shown = pdfleet(cluster, "rollout", "status", POOL, "-n", namespace)
    assert shown.returncode == 3 and "PAUSED" in shown.stdout, shown
    assert uids(cluster, namespace) == before, "nothing replaced while paused"
    resumed = pdfleet(cluster, "rollout", "resume", POOL, "-n", namespace)
    assert resumed.returncode == 0, resumed
    normal = settled(cluster, namespace, not_=good)
    loops_are(cluster, namespace, {"event_loop_normal_disagg_prefill", "event_loop_normal_disagg_decode"})

    # Undo a rollout in progress: back to the last verified revision, rolled out verified like any other. Its
    # canary bakes for an hour, so that it is still in progress whenever the undo comes (a return to a verified
    # revision is not baked).
    cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": {
        "engine": {"env": [{"name": "PDFLEET_E2E_UNDO", "value": "1"}]},
        "rollout": {"verification": {"bake": "1h"}}}}))
    undone = pdfleet(cluster, "rollout", "undo", POOL, "-n", namespace)
    assert undone.returncode == 0, undone
    assert f"rolled back to revision {normal['status']['currentRevision']}" in undone.stdout
    final = settled(cluster, namespace, normal["status"]["currentRevision"])
    assert annotation(final, "pdfleet.dev/rolled-back")["cause"] == "Undo"  # type: ignore[index]
    done = pdfleet(cluster, "rollout", "status", POOL, "-n", namespace)
    assert done.returncode == 0, done
    history = pdfleet(cluster, "rollout", "history", POOL, "-n", namespace)
    assert history.returncode == 0, history
    rows = [line.split() for line in history.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == [good, normal["status"]["currentRevision"]] and rows[-1][-1] == "current", \
        history.stdout


def test_under_load_a_failed_gate_rolls_back_verified_and_no_client_request_fails(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    # The whole episode under load, 2 prefill + 2 decode groups: the bad revision replaces a group, its gate fails,
    # the pool rolls back, and the group is replaced again, each time drained first.
    fleet.apply_pool(cluster, namespace, POOL, rollout={"autoRollback": True})
    good = settled(cluster, namespace)["status"]["currentRevision"]
    url = fleet.router_url(cluster, namespace, POOL, workers=4)
    with client_load(url) as (load, long):
        wait_for("the load flowing", lambda: load.tally.ok >= 40 and long.tally.ok >= 2, timeout=60)
        patch_engine(cluster, namespace, WRONG_LOOP)
        wait_for("the RolloutRolledBack Warning", lambda: fleet.events(cluster, namespace, POOL, "RolloutRolledBack"),
                 timeout=180, interval=0.5)
        back = settled(cluster, namespace, good)
        ok_then = load.tally.ok
        wait_for("requests succeeding on the restored pool", lambda: load.tally.ok >= ok_then + 20, timeout=60)
    print(f"client requests: {load.tally.summary()}; long requests: {long.tally.summary()}")
    assert load.tally.failed == 0 and long.tally.failed == 0, (load.tally.summary(), long.tally.summary(),
                                                               fleet.event_lines(cluster, namespace))
    assert load.tally.in_flight == long.tally.in_flight == 0
    assert all(g["verifiedRevision"] == g["revision"] for g in back["status"]["groups"]), back["status"]["groups"]
    assert len(fleet.events(cluster, namespace, POOL, "RolloutGateFailed")) == 1
