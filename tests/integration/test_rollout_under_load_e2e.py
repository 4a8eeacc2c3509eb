"""End to end: a configuration rollout under client load loses no request. A 2 prefill + 2 decode pool serves a
steady load through the real sglang-router (as in `test_serving_e2e.py`) while `overlapSchedule: Disabled` rolls
out verified (as in `test_verified_rollout_e2e.py`), followed by `pdfleet rollout status --watch` run as people
run it (as in `test_cli_e2e.py`).

Two loads run at once: short requests at the rate asked for, and long ones (a few seconds each) so that every
replaced engine holds requests when its pod is deleted: its drain must let them finish.

Each group is replaced exactly once: a `kubectl get pods --watch` records every engine pod uid the rollout
brings, so a group replaced twice (two uids of its revision) is seen even if the second replacement is over
before the test looks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from pdfleet.podrunner import loadgen
from tests.integration.test_cli_e2e import pdfleet
from tests.support import fleet
from tests.support.cluster import Cluster, WaitTimeout, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.pools import example

pytestmark = pytest.mark.cluster

POOL = "underload"
MODEL = example("local-fleet")["spec"]["model"]["servedName"]
MIN_RATE = 20.0  # client requests per second the issue asks the rollout to be run under
CONCURRENCY = 8
LONG_TOKENS = 400  # about 4 s at the simulator's 10 ms per decode step


def verified_revision(cluster: Cluster, namespace: str) -> str | None:
    status = fleet.pool(cluster, namespace, POOL).get("status") or {}
    verified = fleet.conditions_of(status).get("RolloutVerified") or {}
    done = verified.get("status") == "True" and status.get("currentRevision") == status.get("updateRevision")
    return status["currentRevision"] if done and status.get("phase") == "Ready" else None


class PodWatch:
    """Every (group, uid) of the pool's engine pods the apiserver announced while it ran."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self._proc = subprocess.Popen(
            ["kubectl", "get", "pods", "-n", namespace, "--watch", "--no-headers", "-l",
             f"pdfleet.dev/pool={POOL},app.kubernetes.io/component!=router", "-o",
             r"custom-columns=GROUP:.metadata.labels.pdfleet\.dev/group,UID:.metadata.uid"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)

    def stop(self) -> dict[str, set[str]]:
        self._proc.terminate()
        out, err = self._proc.communicate(timeout=30)
        seen: dict[str, set[str]] = collections.defaultdict(set)
        for line in out.splitlines():
            group, uid = line.split()
            seen[group].add(uid)
        assert seen, f"the pod watch saw nothing: {err}"
        return seen


@contextlib.contextmanager
def client_load(url: str) -> Iterator[tuple[loadgen.Load, loadgen.Load]]:
    """Short and long requests from a thread of their own, stopped (their requests finished) on exit."""
    short = loadgen.Load(url, model=MODEL, concurrency=CONCURRENCY, timeout_s=10)
    long = loadgen.Load(url, model=MODEL, concurrency=2, timeout_s=30, max_tokens=LONG_TOKENS)
    loop = asyncio.new_event_loop()

    async def both() -> None:
        await asyncio.gather(short.run(), long.run())
    thread = threading.Thread(target=lambda: loop.run_until_complete(both()), daemon=True)
    thread.start()
    try:
        yield short, long
    finally:
        for load in (short, long):
            loop.call_soon_threadsafe(load.stop)
        thread.join(timeout=60)


def workers(url: str, key: str) -> list[str]:
    return [w["url"] for w in fleet.workers(url, key) or []]


def uids(cluster: Cluster, namespace: str) -> dict[str, set[str]]:
    by_group: dict[str, set[str]] = collections.defaultdict(set)
    for pod in fleet.engine_pods(cluster, namespace, POOL):
        by_group[pod["metadata"]["labels"]["pdfleet.dev/group"]].add(pod["metadata"]["uid"])
    return by_group


@pytest.fixture
def rollout_log() -> Iterator[list[str]]:
    lines: list[str] = []
    yield lines
    if lines:
        print("\n".join(lines))


def test_disabling_the_overlap_schedule_under_load_rolls_out_verified_and_fails_no_request(
        cluster: Cluster, operator: OperatorProcess, namespace: str, rollout_log: list[str]) -> None:
    fleet.apply_pool(cluster, namespace, POOL)
    try:
        first = wait_for("the pool Ready and verified", lambda: verified_revision(cluster, namespace), timeout=240,
                         interval=0.5)
    except WaitTimeout as e:
        raise AssertionError(f"{e}\nstatus: {fleet.pool(cluster, namespace, POOL).get('status')}\n" +
                             "\n".join(fleet.event_lines(cluster, namespace))) from None
    url = fleet.router_url(cluster, namespace, POOL, workers=4)
    key = fleet.router_key(cluster, namespace, POOL)
    before = uids(cluster, namespace)
    assert sorted(before) == [f"{POOL}-decode-0", f"{POOL}-decode-1", f"{POOL}-prefill-0", f"{POOL}-prefill-1"]
    assert all(len(u) == 1 for u in before.values()), before
    old_revisions = {g["name"]: g["revision"] for g in fleet.pool(cluster, namespace, POOL)["status"]["groups"]}

    watch = PodWatch(cluster, namespace)
    with client_load(url) as (load, long):
        wait_for("the load flowing", lambda: load.tally.ok >= 40 and long.tally.ok >= 2, timeout=60)
        started, sent_at_start = time.monotonic(), load.tally.sent
        cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p",
                        json.dumps({"spec": {"engine": {"overlapSchedule": "Disabled"}}}))
        watched = pdfleet(cluster, "rollout", "status", POOL, "-n", namespace, "--watch", "--timeout", "6m",
                          timeout=420)
        rollout_s = time.monotonic() - started
        sent_during = load.tally.sent - sent_at_start
    seen = watch.stop()
    tally = load.tally.summary()
    rollout_log.append(f"rollout {rollout_s:.1f}s, {sent_during / rollout_s:.1f} req/s during it; client "
                       f"requests: {tally}; long requests: {long.tally.summary()}")
    rollout_log.append(watched.stdout)

    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert load.tally.failed == 0, (tally, fleet.event_lines(cluster, namespace))
    assert long.tally.failed == 0, (long.tally.summary(), fleet.event_lines(cluster, namespace))
    assert load.tally.in_flight == long.tally.in_flight == 0, (tally, long.tally.summary())
    assert long.tally.ok >= 6, long.tally.summary()
    assert sent_during / rollout_s >= MIN_RATE, f"only {sent_during / rollout_s:.1f} req/s during the rollout"
    assert tally["ok_by_kind"].keys() == {"generate", "chat", "chat-stream"}, tally

    status = fleet.pool(cluster, namespace, POOL)["status"]
    assert status["currentRevision"] == status["updateRevision"] != first
    expected_loop = {"prefill": "event_loop_normal_disagg_prefill", "decode": "event_loop_normal_disagg_decode"}
    for group in status["groups"]:
        assert group["eventLoop"] == expected_loop[group["role"]], group
        assert group["verifiedRevision"] == group["revision"] != old_revisions[group["name"]], group
        assert group["restarts"] == 0, group

    # Each group replaced exactly once: its old pod, then one new one, and no other.
    after = uids(cluster, namespace)
    for group, old in before.items():
        assert len(after[group]) == 1 and not after[group] & old, (group, old, after[group])
        assert seen[group] == old | after[group], (group, seen[group], old, after[group])

    # Every new engine is back in the router's rotation, and nothing else is.
    port = fleet.pool(cluster, namespace, POOL)["spec"]["decode"]["port"]
    engines = {f"http://{p['status']['podIP']}:{port}" for p in fleet.engine_pods(cluster, namespace, POOL)}
    wait_for("the router to send to exactly the new engines", lambda: set(workers(url, key)) == engines, timeout=30)

    # An Event per step: one GroupReplaced per group (maxUnavailable 1), each naming its group and the revision.
    replaced = fleet.events(cluster, namespace, POOL, "GroupReplaced")
    steps = [(e["message"].split(" group ")[1].split(" ")[0], e) for e in replaced]
    assert sorted(g for g, _ in steps) == sorted(before), [e["message"] for e in replaced]
    revisions = {g["name"]: g["revision"] for g in status["groups"]}
    for group, event in steps:
        assert event["count"] == 1 and event["message"].endswith(f"with revision {revisions[group]}"), event
