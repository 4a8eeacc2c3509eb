"""`pdfleet rollout status|undo|pause|resume` around rollbacks and pauses, against pools the real planner recorded
(`FakeCluster`): a rolled-back rollout exits 1 whatever the rollback's progress, a paused one says PAUSED, and the
changing commands patch the pool as read or say why not, with the CLI's exit codes."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from pdfleet.operator.cli import __main__ as cli
from pdfleet.operator.cli import report
from pdfleet.operator.cli.report import Exit
from pdfleet.operator.planning import spec_change
from pdfleet.operator.planning.rollout import rollback
from pdfleet.operator.planning.spec_change import SpecChange
from tests.support.pools import pool_body
from tests.unit.test_cli_report import recorded
from tests.unit.test_planning import NOW, FakeCluster
from tests.unit.test_rollback import change_spec, verified_cluster
from tests.unit.test_verification import OVERLAP_DECODE

Body = dict[str, Any]


def rolling_back() -> tuple[FakeCluster, str, str]:
    cluster = verified_cluster()
    old = cluster.pool["status"]["currentRevision"]
    cluster.loops["tiny-decode-0"] = OVERLAP_DECODE
    change_spec(cluster, overlapSchedule="Disabled")
    new = cluster.step().status["updateRevision"]  # type: ignore[index]
    for _ in range(4):
        cluster.step()
    return cluster, old, new


def test_a_rolled_back_rollout_fails_with_exit_1_while_returning_and_once_back() -> None:
    cluster, old, new = rolling_back()
    pool = recorded(cluster)
    state = report.rollout(pool)
    assert state.outcome is Exit.FAILED
    assert state.detail.startswith(f"rolled back from revision {new} to {old} (GateFailed: gate eventLoop failed "
                                   f"for decode group tiny-decode-0")
    assert f"returning to revision {old}: Verifying:" in state.detail
    cluster.converge(limit=20)
    done = report.rollout(recorded(cluster))
    assert done.outcome is Exit.FAILED and done.detail.endswith(f"; revision {old} is verified again")
    lines = report.status_lines(recorded(cluster), now=NOW)
    assert f"Undo to:    none (revision {old}, the last verified, runs now)" in lines, "undo would have nowhere to go"
    assert any(line.startswith(f"Rolled back: 0s ago from revision {new} to {old} (GateFailed: ") for line in lines)

    # A later spec change by anyone makes the rollback history: that rollout is judged on its own.
    change_spec(cluster, overlapSchedule="Enabled", env=[{"name": "A", "value": "b"}])
    cluster.loops.clear()
    cluster.converge(limit=20)
    assert report.rollout(recorded(cluster)).outcome is Exit.COMPLETE


def test_a_paused_rollout_is_in_progress_and_says_paused() -> None:
    cluster = verified_cluster(auto_rollback=False)
    change_spec(cluster, overlapSchedule="Disabled")
    cluster.pool["spec"]["rollout"]["paused"] = True
    cluster.converge(limit=10)
    pool = recorded(cluster)
    state = report.rollout(pool)
    assert state.outcome is Exit.IN_PROGRESS and state.detail.startswith("Paused: rollout paused")
    assert "rollout of revision" in report.rollout_line(pool, state, tty=False)
    assert f"PAUSED: 0/{state.total} groups verified; Paused: " in report.rollout_line(pool, state, tty=False)
    assert "Progressing=Unknown Paused: rollout paused" in "\n".join(report.status_lines(pool, now=NOW))


class PatchingReader:
    """The pool as read, and the patches the command sends (applied like the apiserver, generation test and all)."""

    def __init__(self, pool: Body, *, moved_on: bool = False) -> None:
        self.namespace, self.name = "ns", "tiny"
        self.body, self.moved_on = pool, moved_on
        self.sent: list[SpecChange] = []

    async def pool(self) -> Body:
        return self.body

    async def change(self, pool: Body, change: SpecChange) -> Body | None:
        self.sent.append(change)
        if self.moved_on:
            return None
        self.body = spec_change.apply(pool, change)
        return self.body


def run(reader: PatchingReader, command: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    code = asyncio.run(cli.change_rollout(reader, command, out))  # type: ignore[arg-type]
    return code, out.getvalue().strip(), capsys.readouterr().err.strip()


def test_pause_and_resume_set_and_clear_spec_rollout_paused(capsys: pytest.CaptureFixture[str]) -> None:
    reader = PatchingReader(pool_body())
    assert run(reader, "resume", capsys) == (Exit.COMPLETE, "InferencePool ns/tiny is not paused", "")
    code, out, _ = run(reader, "pause", capsys)
    assert code == Exit.COMPLETE and out.startswith("InferencePool ns/tiny paused: no new group replacement starts")
    assert reader.body["spec"]["rollout"]["paused"] is True
    assert run(reader, "pause", capsys) == (Exit.COMPLETE, "InferencePool ns/tiny is already paused", "")
    assert run(reader, "resume", capsys) == (Exit.COMPLETE, "InferencePool ns/tiny resumed", "")
    assert "paused" not in reader.body["spec"]["rollout"]
    assert len(reader.sent) == 2


def test_undo_patches_back_or_fails_with_exit_1_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(PatchingReader(pool_body()), "undo", capsys)
    assert (code, out) == (Exit.FAILED, "")
    assert err == ("error: InferencePool ns/tiny has no verified revision recorded (annotation "
                   "pdfleet.dev/verified-spec): it never completed a verified rollout, so there is nothing to go "
                   "back to")
    cluster = verified_cluster(auto_rollback=False)
    old = cluster.pool["status"]["currentRevision"]
    change_spec(cluster, overlapSchedule="Disabled")
    code, out, _ = run(PatchingReader(recorded(cluster), moved_on=True), "undo", capsys)
    assert code == Exit.FAILED
    reader = PatchingReader(recorded(cluster))
    code, out, err = run(reader, "undo", capsys)
    assert (code, err) == (Exit.COMPLETE, "")
    assert out == (f"InferencePool ns/tiny rolled back to revision {old} (the last verified); follow it with "
                   f"`pdfleet rollout status tiny -n ns --watch`")
    assert reader.body["spec"]["engine"].get("overlapSchedule", "Enabled") == "Enabled"
    assert rollback.latest_rollback(reader.body).cause == rollback.UNDO  # type: ignore[union-attr]
