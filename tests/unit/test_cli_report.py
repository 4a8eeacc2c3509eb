"""The CLI's output and exit codes against recorded pools: statuses written by the real planner (`FakeCluster`
walked through a pool's life, engines answering the verification gates or not) and Events as the operator posts
them (`kube.events.event_body`)."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import pytest

from pdfleet.operator.cli import report
from pdfleet.operator.cli.report import Exit
from pdfleet.operator.kube.events import event_body
from pdfleet.operator.planning.plan import Event
from pdfleet.runtime.patches import catalogue
from tests.support.pools import NO_BAKE, pool_body
from tests.unit.test_planning import NOW, FakeCluster
from tests.unit.test_verification import OVERLAP_DECODE, condition, disable_overlap

Body = dict[str, Any]


def recorded(cluster: FakeCluster) -> Body:
    """The pool as `kubectl get -o json` would return it: a JSON round trip of what the planner stored."""
    return json.loads(json.dumps(cluster.pool))


def ready_cluster() -> FakeCluster:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=1, decode=2))
    cluster.converge()
    return cluster


def verifying_cluster() -> FakeCluster:
    """overlapSchedule: Disabled rolling out; tiny-decode-0 replaced and Ready, its agents not answering yet."""
    cluster = ready_cluster()
    cluster.engines = False
    disable_overlap(cluster)
    for _ in range(3):
        cluster.step()
    return cluster


def failed_cluster() -> FakeCluster:
    cluster = ready_cluster()
    cluster.loops["tiny-decode-0"] = OVERLAP_DECODE  # the new engines still run the overlap loop
    disable_overlap(cluster)
    cluster.converge(limit=10)
    return cluster


def pods_of(cluster: FakeCluster) -> list[Body]:
    return [copy.deepcopy(o) for (kind, _), o in cluster.owned.items() if kind == "Pod"]


def warning(pool: Body, reason: str, message: str, at: datetime.datetime, *, uid: str | None = None) -> Body:
    body = event_body(pool, Event("Warning", reason, message))
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    body["firstTimestamp"] = body["lastTimestamp"] = stamp
    body["metadata"]["name"] = f"{pool['metadata']['name']}.{reason.lower()}"
    if uid is not None:
        body["involvedObject"]["uid"] = uid
    return body


def test_a_ready_verified_pool_completes_with_exit_0_and_shows_its_groups() -> None:
    cluster = ready_cluster()
    pool = recorded(cluster)
    state = report.rollout(pool)
    assert (state.outcome, state.done, state.total) == (Exit.COMPLETE, 3, 3)
    revision = pool["status"]["updateRevision"]
    assert report.rollout_line(pool, state, tty=False) == (
        f"pool ns/tiny: rollout of revision {revision} complete: 3/3 groups verified; "
        f"every group of revision {revision} passed verification")

    lines = report.status_lines(pool, pods=pods_of(cluster), now=NOW)
    text = "\n".join(lines)
    assert "Phase:      Ready" in lines
    assert f"Revision:   current {revision}, update {revision}" in lines
    assert "Conditions: all fine" in lines and "Last incident: none (no Warning Event)" in lines
    assert f"Patches:    {', '.join(catalogue.recommended_for('0.5.23'))} (Recommended)" in lines
    assert lines[lines.index("Decode: 2/2 ready, 2 updated (verified at the update revision)") + 1].split() == [
        "GROUP", "REVISION", "VERDICT", "READY", "VERIFIED", "RESTARTS"]
    for group in pool["status"]["groups"]:
        row = next(line.split() for line in lines if line.strip().startswith(group["name"] + " "))
        assert row == [group["name"], group["revision"], "Healthy", "1/1", "yes", "0"], text


def test_a_rollout_in_progress_names_the_gate_and_group_it_waits_on_with_exit_3() -> None:
    cluster = verifying_cluster()
    assert condition(cluster, "RolloutVerified")["reason"] == "Verifying"
    pool = recorded(cluster)
    state = report.rollout(pool)
    assert (state.outcome, state.done, state.total) == (Exit.IN_PROGRESS, 0, 3)
    assert state.detail.startswith("waiting for gate eventLoop of decode group tiny-decode-0: expected "
                                   "event_loop_normal_disagg_decode: no rank agent")
    lines = report.status_lines(pool, pods=pods_of(cluster), now=NOW)
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("  tiny-")}
    assert rows["tiny-decode-0"][2:] == ["Unknown", "1/1", "waiting:", "eventLoop", "0"]
    # The groups not replaced yet: verified at the revision they run, which is not the one the spec asks for.
    assert rows["tiny-decode-1"][2:5] == ["(outdated)", "Healthy", "1/1"] and rows["tiny-decode-1"][5] == "yes"
    assert rows["tiny-prefill-0"][2] == "(outdated)"
    assert any(line.startswith("  RolloutVerified=Unknown Verifying: 0/3 group(s) verified") for line in lines)
    assert any(line.startswith("  Progressing=True ") for line in lines)
    assert not any(line.startswith("  Accepted=") or line.startswith("  Degraded=") for line in lines)


def test_a_rollout_with_surge_shows_its_surge_group_and_counts_only_groups_below_replicas() -> None:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=1, decode=2, rollout__maxSurge={"decode": 1}))
    cluster.converge()
    cluster.engines = False  # the surge group's agents do not answer: it stays unverified
    disable_overlap(cluster)
    for _ in range(3):
        cluster.step()
    pool = recorded(cluster)
    state = report.rollout(pool)
    assert (state.outcome, state.done, state.total) == (Exit.IN_PROGRESS, 0, 3)
    assert state.detail.startswith("waiting for gate eventLoop of decode group tiny-decode-2:"), state.detail
    lines = report.status_lines(pool, pods=pods_of(cluster), now=NOW)
    assert "Decode: 1/2 ready, 0 updated (verified at the update revision), 1 surge group(s) above replicas " \
           "(maxSurge)" in lines, lines
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("  tiny-")}
    assert set(rows) == {"tiny-decode-0", "tiny-decode-1", "tiny-decode-2", "tiny-prefill-0"}
    assert rows["tiny-decode-0"][2] == "(outdated)" and rows["tiny-decode-1"][2] == "(outdated)", \
        "no old group goes while the surge canary is unverified"


def test_a_failed_gate_exits_1_with_the_gate_group_and_what_was_seen() -> None:
    cluster = failed_cluster()
    pool = recorded(cluster)
    state = report.rollout(pool)
    assert state.outcome is Exit.FAILED
    message = condition(cluster, "RolloutVerified")["message"]
    assert state.detail == f"GateFailed: {message}"
    line = report.rollout_line(pool, state, tty=False)
    assert " FAILED: 0/3 groups verified; GateFailed: gate eventLoop failed for decode group tiny-decode-0" in line
    assert f"expected event_loop_normal_disagg_decode, seen {OVERLAP_DECODE}" in line

    older = warning(pool, "GroupDesync", "an older incident", NOW - datetime.timedelta(hours=2))
    newest = warning(pool, "RolloutGateFailed", f"rollout stopped: {message}", NOW - datetime.timedelta(seconds=90))
    predecessor = warning(pool, "GroupDead", "about a deleted pool of the same name", NOW, uid="uid-gone")
    lines = report.status_lines(pool, pods=pods_of(cluster), events=[older, newest, predecessor], now=NOW)
    assert "Phase:      Failed" in lines
    assert f"Last incident: 1m ago RolloutGateFailed: rollout stopped: {message}" in lines
    row = next(line.split() for line in lines if line.strip().startswith("tiny-decode-0 "))
    assert row[4:6] == ["failed:", "eventLoop"]


def test_the_rollout_to_the_normal_loop_once_verified_exits_0() -> None:
    cluster = verifying_cluster()
    cluster.engines = True
    cluster.converge(limit=30)
    pool = recorded(cluster)
    state = report.rollout(pool)
    assert (state.outcome, state.done, state.total) == (Exit.COMPLETE, 3, 3)
    assert pool["status"]["currentRevision"] == state.revision


def test_a_status_older_than_the_spec_is_not_trusted_either_way() -> None:
    for cluster in (ready_cluster(), failed_cluster()):
        pool = recorded(cluster)
        pool["metadata"]["generation"] = 2  # edited since the operator last wrote status
        state = report.rollout(pool)
        assert (state.outcome, state.done, state.total, state.revision) == (Exit.IN_PROGRESS, 0, 3, None)
        assert report.rollout_line(pool, state, tty=False) == (
            "pool ns/tiny: rollout in progress: 0/3 groups verified; waiting for the operator to observe "
            "generation 2 (status is of generation 1)")


def test_a_rejected_spec_fails_the_rollout() -> None:
    pool = recorded(ready_cluster())
    accepted = next(c for c in pool["status"]["conditions"] if c["type"] == "Accepted")
    accepted.update(status="False", reason="InvalidSpec", message="decode.tp must equal gpusPerNode")
    state = report.rollout(pool)
    assert (state.outcome, state.detail) == (Exit.FAILED, "spec rejected (InvalidSpec): decode.tp must equal "
                                                          "gpusPerNode")


def test_a_status_this_version_cannot_read_is_an_error_naming_the_field() -> None:
    pool = recorded(ready_cluster())
    pool["status"]["phase"] = "Sideways"
    with pytest.raises(report.Unreadable, match=r"InferencePool ns/tiny .*status\.phase"):
        report.rollout(pool)


def test_the_progress_bar_shows_only_on_a_terminal() -> None:
    pool = recorded(verifying_cluster())
    state = report.Rollout(Exit.IN_PROGRESS, 1, 4, "abc", "waiting")
    assert report.rollout_line(pool, state, tty=True) == \
        "[######------------------] pool ns/tiny: rollout of revision abc in progress: 1/4 groups verified; waiting"
    plain = report.rollout_line(pool, state, tty=False)
    assert "[" not in plain and "#" not in plain and "1/4 groups verified" in plain
    assert report.bar(0, 4) == "[" + "-" * 24 + "]" and report.bar(4, 4) == "[" + "#" * 24 + "]"


def test_the_newest_evidence_configmap_is_named() -> None:
    def evidence(name: str, taken: str) -> Body:
        return {"metadata": {"name": name, "annotations": {"pdfleet.dev/evidence-time": taken}}}
    assert report.newest_evidence([evidence("tiny-decode-0-evidence-2", "2026-11-30T11:00:00Z"),
                                   evidence("tiny-decode-1-evidence-1", "2026-11-30T11:30:00Z"),
                                   evidence("tiny-decode-0-evidence-1", "2026-11-30T10:00:00Z")]) == \
        "tiny-decode-1-evidence-1"
    lines = report.status_lines(recorded(ready_cluster()), now=NOW,
                                evidence=[evidence("tiny-decode-0-evidence-1", "2026-11-30T10:00:00Z")])
    assert "Evidence:   tiny-decode-0-evidence-1" in lines


@pytest.mark.parametrize(("seconds", "text"), [(5, "5s"), (90, "1m"), (7200, "2h"), (3 * 86400, "3d")])
def test_ages_read_like_kubectl(seconds: int, text: str) -> None:
    assert report.age(NOW - datetime.timedelta(seconds=seconds), NOW) == text


def test_status_shows_a_roles_inference_pool_role_and_the_ratio_band() -> None:
    pool = recorded(verifying_cluster())
    pool["spec"]["decode"]["scaleTarget"] = True
    pool["spec"]["prefill"]["scaleTarget"] = True
    pool["spec"]["scaling"] = {"ratio": {"minDecodePerPrefill": "1", "maxDecodePerPrefill": "2", "onScale": "Clamp"}}
    target = {"metadata": {"name": "tiny-decode"}, "spec": {"pool": "tiny", "role": "decode", "replicas": 3},
              "status": {"message": "decode clamped to 2 group(s) beside prefill at 1"}}
    lines = report.status_lines(pool, scale_targets=[target], now=NOW)
    assert "Ratio band: 1 to 2 decode group(s) per prefill group, a scale outside it: Clamp" in lines
    decode = lines.index(next(line for line in lines if line.startswith("Decode: ")))
    assert lines[decode + 1] == ("  scale target: InferencePoolRole tiny-decode asks 3 group(s); decode clamped to 2 "
                                 "group(s) beside prefill at 1")
    prefill = lines.index(next(line for line in lines if line.startswith("Prefill: ")))
    assert lines[prefill + 1] == "  scale target: its InferencePoolRole is not there yet"
    plain = report.status_lines(recorded(verifying_cluster()), now=NOW)
    assert not any("scale target" in line or line.startswith("Ratio band") for line in plain)


def test_status_shows_what_the_autoscaler_decided_for_a_role() -> None:
    pool = recorded(verifying_cluster())
    pool["spec"]["autoscaling"] = {"decode": {"minReplicas": 1, "maxReplicas": 4,
                                              "targets": {"kvCacheUsage": "0.5"}}}
    lines = report.status_lines(pool, now=NOW)
    decode = lines.index(next(line for line in lines if line.startswith("Decode: ")))
    assert lines[decode + 1] == "  autoscaling: 1 to 4 group(s); no decision yet"
    pool["status"]["autoscaling"] = {"decode": {
        "desired": 2, "current": 1, "rule": "KVCacheUsage", "lastScaleTime": "2026-01-01T11:58:00Z",
        "message": "decode 1 -> 2 (KVCacheUsage): KV cache usage 0.90 (target 0.50), over 1 serving group(s)"}}
    lines = report.status_lines(pool, now=NOW)
    assert lines[decode + 1].startswith("  autoscaling: 1 to 4 group(s), 1 serving, last scaled ")
    assert lines[decode + 1].endswith(" ago: decode 1 -> 2 (KVCacheUsage): KV cache usage 0.90 (target 0.50), over "
                                      "1 serving group(s)")
    assert not any("autoscaling" in line for line in report.status_lines(recorded(verifying_cluster()), now=NOW))
