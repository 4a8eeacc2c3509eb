"""Issue 25's autoscaling beside the operator's other work, on the local fleet (the shared operator, the real
router, the engine simulator): a role the autoscaler grows while a rollout replaces its groups, a sick group
restarted while its role is about to shrink, and a load that swings faster than the down window. Nothing of the
operator is staged: the load, the spec change and the fault are a user's, and each test checks what a user
would: every group replaced or restarted once, the only healthy group of a role kept, the size changing no more
often than the windows allow, no client request failed. docs/scaling.md tells what each shows."""

from __future__ import annotations

import collections
import contextlib
import datetime
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pdfleet.podrunner import loadgen
from tests.integration.test_autoscale_e2e import loads
from tests.support import fleet, scale_events
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.pools import example
from tests.support.watches import Watch, watching

pytestmark = pytest.mark.cluster

MODEL = example("local-fleet")["spec"]["model"]["servedName"]
TP1 = {"tp": 1, "gpusPerNode": 1}  # one rank per group: fewer processes on the 2-core machine
LONG_TOKENS = 400  # about 4 s at the simulator's 10 ms per decode step
POD_COLUMNS = (r"custom-columns=GROUP:.metadata.labels.pdfleet\.dev/group,UID:.metadata.uid,"
               "DELETED:.metadata.deletionTimestamp")


def watching_engine_pods(cluster: Cluster, namespace: str, pool: str) -> contextlib.AbstractContextManager[Watch]:
    """Every version of the pool's engine pods: group, uid, and deletionTimestamp (`<none>` until deleted)."""
    return watching(cluster, "pods", "-n", namespace, "-l",
                    f"pdfleet.dev/pool={pool},app.kubernetes.io/component!=router", output=POD_COLUMNS)


def uids_by_group(watch: Watch) -> dict[str, set[str]]:
    """Every engine pod uid the watch saw, by group."""
    seen: dict[str, set[str]] = collections.defaultdict(set)
    for version in watch.seen:
        group, uid, _ = version.line.split()
        seen[group].add(uid)
    return seen


def story(cluster: Cluster, namespace: str, *watches: Watch) -> str:
    """What a failed assertion shows: the Events and every version the watches saw."""
    lines = fleet.event_lines(cluster, namespace)
    for watch in watches:
        lines += [f"{v.wall:%H:%M:%S.%f} {v.line}" for v in watch.seen]
    return "\n".join(lines)


def pool_at(cluster: Cluster, namespace: str, name: str) -> tuple[str | None, str | None]:
    """(currentRevision, updateRevision): different while a rollout is under way."""
    status = fleet.pool(cluster, namespace, name).get("status") or {}
    return status.get("currentRevision"), status.get("updateRevision")


def verified(cluster: Cluster, namespace: str, name: str) -> str | None:
    """The revision every group runs, verified, with the pool Ready; None before."""
    status = fleet.pool(cluster, namespace, name).get("status") or {}
    condition = fleet.conditions_of(status).get("RolloutVerified") or {}
    settled = condition.get("status") == "True" and status.get("currentRevision") == status.get("updateRevision")
    return status["currentRevision"] if settled and status.get("phase") == "Ready" else None


# ---- 1. a scale-up while a rollout replaces the role --------------------------------------------------------

ROLLING = "rolling"
# Decode grows on its running requests (one per engine), never shrinks within the test: the rollout alone
# replaces groups here. 2 groups at least, so that one serves while the other is replaced.
GROWS = {"minReplicas": 2, "maxReplicas": 3, "targets": {"runningPerEngine": 1},
         "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0},
                      "scaleDown": {"stabilizationWindowSeconds": 600}, "minIntervalSeconds": 5}}
REVISIONS = "jsonpath={.spec.decode.replicas}|{.status.currentRevision}|{.status.updateRevision}{\"\\n\"}"


@pytest.mark.effect("spec.autoscaling.decode.behavior.scaleUp.stabilizationWindowSeconds")
def test_a_role_autoscaled_up_while_a_rollout_replaces_it_is_replaced_once_and_the_rollout_completes(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    """A 2+2 pool rolls out a spec change (decode first, one group at a time) while long streams load decode: once
    its first new group serves, the autoscaler grows decode to 3 in the middle of the rollout. The new group
    starts at the new revision and is not replaced again, each old group is replaced once, the rollout is not
    started over and completes, and no client request fails."""
    fleet.apply_pool(cluster, namespace, ROLLING, prefill={"replicas": 2, **TP1}, decode={"replicas": 2, **TP1},
                     autoscaling={"decode": GROWS})
    first = wait_for("the pool Ready and verified", lambda: verified(cluster, namespace, ROLLING), timeout=240,
                     interval=0.5)
    url = fleet.router_url(cluster, namespace, ROLLING, workers=4)
    before = {p["metadata"]["labels"]["pdfleet.dev/group"]: p["metadata"]["uid"]
              for p in fleet.engine_pods(cluster, namespace, ROLLING)}
    old = {g["role"]: g["revision"] for g in fleet.pool(cluster, namespace, ROLLING)["status"]["groups"]}
    assert sorted(before) == [f"{ROLLING}-decode-0", f"{ROLLING}-decode-1", f"{ROLLING}-prefill-0",
                              f"{ROLLING}-prefill-1"], before

    light = loadgen.Load(url, model=MODEL, concurrency=1, timeout_s=30)
    heavy = loadgen.Load(url, model=MODEL, concurrency=8, timeout_s=60, max_tokens=LONG_TOKENS)
    with watching(cluster, "pdpool", ROLLING, "-n", namespace, output=REVISIONS) as versions, \
            watching_engine_pods(cluster, namespace, ROLLING) as pods, loads(light):
        wait_for("the light load flowing", lambda: light.tally.ok >= 5, timeout=60)
        cluster.kubectl("patch", "pdpool", ROLLING, "-n", namespace, "--type=merge", "-p",
                        json.dumps({"spec": {"engine": {"overlapSchedule": "Disabled"}}}))
        patched = time.monotonic()
        wait_for("the rollout under way", lambda: pool_at(cluster, namespace, ROLLING)[1] not in (None, first),
                 timeout=60, interval=0.2)
        with loads(heavy):  # only now: decode's old groups count for nothing, the new ones carry the load
            new = wait_for("the rollout completed",
                           lambda: r if (r := verified(cluster, namespace, ROLLING)) not in (None, first) else None,
                           timeout=300, interval=0.5)
        completed_at = time.monotonic()
    said = story(cluster, namespace, versions, pods)
    assert light.tally.failed == heavy.tally.failed == 0, (light.tally.summary(), heavy.tally.summary(), said)
    assert light.tally.in_flight == heavy.tally.in_flight == 0, (light.tally.summary(), heavy.tally.summary())

    # The scale was taken in the middle of the rollout: the first version with 3 decode groups still had the
    # old revision current. And the rollout went to one new revision only (the scale made none).
    rows = [(v.at, *v.line.split("|")) for v in versions.seen]
    grown = next((r for r in rows if r[1] == "3"), None)
    assert grown is not None and list(grown[2:]) == [first, new], ("decode never grew during the rollout", said)
    assert {r[3] for r in rows} <= {first, new}, said
    print(f"rollout {completed_at - patched:.0f} s, decode 2 -> 3 at {grown[0] - patched:.0f} s into it; light "
          f"{light.tally.summary()}; long streams {heavy.tally.summary()}")
    up = [e["message"] for e in fleet.events(cluster, namespace, ROLLING, "ScaledUp")]
    assert len(up) == 1 and up[0].startswith("decode 2 -> 3 ("), up
    assert fleet.events(cluster, namespace, ROLLING, "ScaledDown") == []

    # Each old group replaced once (its old pod, one new one, nothing else); the group the scale added was
    # created once, at the new revision, and never replaced.
    seen = uids_by_group(pods)
    after = {p["metadata"]["labels"]["pdfleet.dev/group"]: p for p in fleet.engine_pods(cluster, namespace, ROLLING)
             if not p["metadata"].get("deletionTimestamp")}
    added = set(after) - set(before)
    assert set(before) <= set(after) and len(added) == 1, sorted(after)
    assert [after[g]["metadata"]["labels"]["pdfleet.dev/role"] for g in added] == ["decode"], sorted(after)
    for group, pod in after.items():
        expected = {before[group], pod["metadata"]["uid"]} if group in before else {pod["metadata"]["uid"]}
        assert seen[group] == expected and pod["metadata"]["uid"] not in before.values(), (group, seen[group], said)
    # Every group, the added one too, at its role's new revision and verified there; none restarted.
    groups = fleet.pool(cluster, namespace, ROLLING)["status"]["groups"]
    assert sorted(g["name"] for g in groups) == sorted(after), groups
    revisions = {g["role"]: {g["revision"]} for g in groups}
    for g in groups:
        revisions[g["role"]].add(g["revision"])
    assert all(len(r) == 1 and old[role] not in r for role, r in revisions.items()), (old, groups)
    assert all(g.get("verifiedRevision") == g["revision"] and not g.get("restarts") for g in groups), groups
    replaced = fleet.events(cluster, namespace, ROLLING, "GroupReplaced")
    named = sorted(e["message"].split(" group ")[1].split(" ")[0] for e in replaced)
    assert named == sorted(before) and all(e.get("count", 1) == 1 for e in replaced), said
    completed = fleet.events(cluster, namespace, ROLLING, "RolloutCompleted")
    assert [e["message"] for e in completed] == \
        [f"rollout from revision {first} to {new} completed: all 5 group(s) replaced and verified"], said


# ---- 2. a sick group while its role would shrink ------------------------------------------------------------

SICK = "sick"
LOAD_S = 18  # each engine pretends to load its model this long: a restarted group is out of service that long
DOWN_S = 15
# Decode at 2 groups with nothing to do: the autoscaler shrinks it to 1 once DOWN_S of idle recommendations
# passed. The fault comes at once, is judged within desyncAfter (3 s) and a poll, and its group is out of service
# until about LOAD_S after its restart: the window runs out about 10 s into that, whatever the machine's load
# adds to either side.
SHRINKS = {"minReplicas": 1, "maxReplicas": 2, "targets": {"runningPerEngine": 2},
           "behavior": {"scaleDown": {"stabilizationWindowSeconds": DOWN_S}, "minIntervalSeconds": 5}}
# status.groups as JSON: a jsonpath `range` ends kubectl's watch after its first line (kubectl 1.34).
GROUPS = "jsonpath={.spec.decode.replicas}|{.status.decode.ready}|{.status.groups}{\"\\n\"}"


def _groups(line: str) -> tuple[str, str, dict[str, tuple[str, str]]]:
    """(spec.decode.replicas, status.decode.ready, {group: (verdict, restarts)}) of one version."""
    replicas, ready, groups = line.split("|", 2)
    return replicas, ready, {g["name"]: (g.get("verdict", ""), str(g.get("restarts", 0)))
                             for g in json.loads(groups or "[]")}


@pytest.mark.effect("spec.autoscaling.decode.behavior.scaleDown.stabilizationWindowSeconds")
def test_a_sick_group_of_a_role_about_to_shrink_is_restarted_once_and_the_role_shrinks_once_all_serve(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    """An idle decode role of 2 groups (TP 2) is about to shrink to 1 when the group that would stay (decode-0)
    desyncs. It is restarted once, and while it is out of service (detection, then its model's load) its down
    window runs out: the autoscaler must not shrink the role then, since the group that would go is its only
    healthy one. Once both serve again, it shrinks."""
    fleet.apply_pool(cluster, namespace, SICK, prefill={"replicas": 1, **TP1}, decode={"replicas": 2},
                     router={"replicas": 0}, engine={"env": [{"name": "PDFLEET_SIM_LOAD_S", "value": str(LOAD_S)}]},
                     autoscaling={"decode": SHRINKS})
    sick_group = f"{SICK}-decode-0"

    def shrunk_and_ready() -> bool:
        pool = fleet.pool(cluster, namespace, SICK)
        return pool["spec"]["decode"]["replicas"] == 1 and (pool.get("status") or {}).get("phase") == "Ready"
    with watching(cluster, "pdpool", SICK, "-n", namespace, output=GROUPS) as versions, \
            watching_engine_pods(cluster, namespace, SICK) as pods:
        fleet.wait_ready(cluster, namespace, SICK, timeout=240)
        [pod] = fleet.engine_pods(cluster, namespace, SICK, group=sick_group)
        fleet.inject(cluster, namespace, pod["metadata"]["name"], "desync")
        injected = datetime.datetime.now(datetime.UTC)
        wait_for("decode shrunk to 1 group, Ready", shrunk_and_ready, timeout=240, interval=0.5)
    said = story(cluster, namespace, versions, pods)

    restarted = fleet.events(cluster, namespace, SICK, "GroupRestarted")
    assert len(restarted) == 1 and restarted[0].get("count", 1) == 1, said
    assert restarted[0]["message"].startswith(f"restarting decode group {sick_group} as a unit: Desync"), said
    seen = uids_by_group(pods)
    assert len(seen[sick_group]) == 2, ("the sick group restarted once", seen, said)
    assert len(seen[f"{SICK}-decode-1"]) == 1, ("the healthy group was never recreated", seen, said)

    # The role shrank only after the restarted group served again (both decode groups Ready, decode-0 Healthy
    # after its restart); the healthy group's pod was not deleted before then.
    rows = [(v, *_groups(v.line)) for v in versions.seen]
    back = next((v for v, _, ready, groups in rows
                 if ready == "2" and groups.get(sick_group) == ("Healthy", "1")), None)
    shrunk = next((v for v, replicas, _, _ in rows if replicas == "1"), None)
    assert back is not None and shrunk is not None and back.at <= shrunk.at, said
    healthy_gone = [v for v in pods.seen if v.line.split()[0] == f"{SICK}-decode-1" and v.line.split()[2] != "<none>"]
    assert all(v.at >= back.at for v in healthy_gone), said
    down = [e["message"] for e in fleet.events(cluster, namespace, SICK, "ScaledDown")]
    assert len(down) == 1 and down[0].startswith("decode 2 -> 1 ("), down

    # And the scale-down was held back, not merely late: the idle recommendations that began before the fault
    # had filled the down window while the sick group was still out of service.
    history = fleet.pool(cluster, namespace, SICK)["status"]["autoscaling"]["decode"]["recommendations"]
    low_since = next(datetime.datetime.fromisoformat(r["time"].replace("Z", "+00:00")) for i, r in enumerate(history)
                     if all(x["replicas"] <= 1 for x in history[i:]))
    expired = low_since + datetime.timedelta(seconds=DOWN_S)
    print(f"after the fault: the down window ran out at {(expired - injected).total_seconds():.0f} s, the "
          f"restarted group served at {(back.wall - injected).total_seconds():.0f} s, decode shrank at "
          f"{(shrunk.wall - injected).total_seconds():.0f} s")
    assert injected <= expired <= back.wall - datetime.timedelta(seconds=1), \
        (f"the down window ran out at {expired:%H:%M:%S}, the fault came at {injected:%H:%M:%S}, the group served "
         f"again at {back.wall:%H:%M:%S}", history, said)


# ---- 3. a load that swings faster than the down window ------------------------------------------------------

SWINGING = "swinging"
HIGH, LOW = 12, 1  # requests a second: decode needs 2 groups for the first (its running requests), 1 for the second
HIGH_S, LOW_S, CYCLES, TAIL_S = 5, 4, 4, 16  # each low phase much shorter than the down window; the tail longer
UP_S, SWING_DOWN_S, INTERVAL_S = 2, 12, 5


def swinging_pool(namespace: str) -> dict[str, Any]:
    """examples/local-autoscaling.yaml (its simulator capacity, small enough to load here) with decode alone
    autoscaled, on its running requests, and no band: prefill stays at 1 group."""
    body = example("local-autoscaling")
    body["metadata"] = {"name": SWINGING, "namespace": namespace}
    body["spec"].pop("scaling")
    body["spec"]["autoscaling"] = {"decode": {
        "minReplicas": 1, "maxReplicas": 3, "targets": {"runningPerEngine": 3},
        "behavior": {"scaleUp": {"stabilizationWindowSeconds": UP_S},
                     "scaleDown": {"stabilizationWindowSeconds": SWING_DOWN_S}, "minIntervalSeconds": INTERVAL_S}}}
    return body


@pytest.mark.effect("spec.autoscaling.decode.behavior.minIntervalSeconds")
def test_a_load_swinging_faster_than_the_down_window_grows_the_role_and_shrinks_it_only_once_it_stays_low(
        cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path) -> None:
    """An open loop alternating 12 and 1 requests a second (5 s and 4 s) four times, then 1 a second for 16 s,
    through the real router. Decode grows with the first high phases and stays: no low phase lasts the 12 s down
    window. It shrinks once the load stayed low for the window, its scales are minIntervalSeconds apart, and no
    request fails."""
    cluster.kubectl("apply", "-f", "-", input=json.dumps(swinging_pool(namespace)))
    fleet.wait_ready(cluster, namespace, SWINGING, timeout=240)
    url = fleet.router_url(cluster, namespace, SWINGING, workers=2)
    steps = ",".join([f"{HIGH}x{HIGH_S},{LOW}x{LOW_S}"] * CYCLES + [f"{LOW}x{TAIL_S}"])
    out = tmp_path / "load.json"
    with watching(cluster, "pdpool", SWINGING, "-n", namespace,
                  output="jsonpath={.spec.decode.replicas}|{.status.decode.ready}{\"\\n\"}") as versions:
        began = datetime.datetime.now(datetime.UTC)
        load = subprocess.Popen([sys.executable, "-m", "pdfleet.podrunner", "load", "--url", url, "--model", MODEL,
                                 "--steps", steps, "--timeout", "30", "--json"],
                                stdout=out.open("w"), stderr=subprocess.STDOUT, text=True)
        try:
            load.wait(timeout=CYCLES * (HIGH_S + LOW_S) + TAIL_S + 90)
        finally:
            if load.poll() is None:
                load.kill()
        wait_for("decode back at 1 group, Ready",
                 lambda: versions.seen and versions.seen[-1].line == "1|1", timeout=120, interval=0.5)
    said = story(cluster, namespace, versions)
    text = out.read_text()
    assert load.returncode == 0, text[-3000:]
    summary = json.loads(text.strip().splitlines()[-1])
    assert summary["failed"] == 0 and summary["in_flight"] == 0 and summary["ok"] == summary["sent"], summary

    # The load began at `began` or a little later (the client's start): its last high phase ended no earlier
    # than this, and a recommendation of 2 or more was made in it.
    swung_until = began + datetime.timedelta(seconds=CYCLES * (HIGH_S + LOW_S) - LOW_S)
    scales = scale_events.own_scales(cluster, namespace, SWINGING, "decode")
    print(f"{summary['sent']} requests, {summary['failed']} failed; the swing ended at "
          f"{CYCLES * (HIGH_S + LOW_S) - LOW_S} s; " +
          "; ".join(f"{(t - began).total_seconds():.0f} s {m.split(':')[0]}" for t, _, m in scales))
    ups = [t for t, reason, _ in scales if reason == "ScaledUp"]
    downs = [t for t, reason, _ in scales if reason == "ScaledDown"]
    assert ups and ups[0] < swung_until, ("the swinging load never grew decode", scales, said)
    assert downs and all(t >= swung_until + datetime.timedelta(seconds=SWING_DOWN_S - 2) for t in downs), \
        ("decode shrank while the load still swung", scales, said)
    assert max(ups) < min(downs), ("decode grew again after it shrank", scales)
    assert not scale_events.stabilisation_breaches(scales, interval=INTERVAL_S, down_window=SWING_DOWN_S), scales
    # Every size the spec took is one of these scales, seen by the watch in order: up, then down.
    sizes = [int(v.line.split("|")[0]) for v in versions.seen]
    changes = [(a, b) for a, b in itertools.pairwise(sizes) if a != b]
    assert len(changes) == len(scales), (changes, scales, said)
    assert [b > a for a, b in changes] == [True] * len(ups) + [False] * len(downs), changes
