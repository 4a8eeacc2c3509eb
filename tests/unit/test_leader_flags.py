"""The operator's leader-election flags: client-go's defaults, controller-runtime's duration spelling, and
refusals that say what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.operator import __main__ as cli


def test_leader_election_is_off_unless_asked_for() -> None:
    assert cli.parse_args([]).leader_elect is False


def test_durations_read_as_controller_runtime_writes_them() -> None:
    args = cli.parse_args(["--leader-elect", "--leader-elect-namespace=ops", "--leader-elect-lease-duration=1m",
                           "--leader-elect-renew-deadline=20s", "--leader-elect-retry-period=500ms"])
    assert cli._timings(args) == cli.Timings(lease_duration=60, renew_deadline=20, retry_period=0.5)
    assert args.leader_elect_id == "pdfleet-operator"


def test_outside_a_pod_the_lease_namespace_is_required(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    with pytest.raises(SystemExit):
        cli.parse_args(["--leader-elect"])
    assert "--leader-elect needs --leader-elect-namespace outside a pod" in capsys.readouterr().err


def test_in_a_pod_the_lease_lives_in_the_pods_namespace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "namespace").write_text("pdfleet-system")
    monkeypatch.setattr(cli, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "namespace")
    assert cli.parse_args(["--leader-elect"]).leader_elect_namespace == "pdfleet-system"


def test_timings_that_would_let_two_leaders_overlap_are_refused_at_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--leader-elect", "--leader-elect-namespace=ops", "--leader-elect-renew-deadline=20s"])
    assert "must be greater than the renew deadline" in capsys.readouterr().err


def test_the_identity_is_the_pod_name_and_a_random_suffix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "pdfleet-7d9f-abcde")
    first, second = cli._identity(), cli._identity()
    assert first.startswith("pdfleet-7d9f-abcde_") and second.startswith("pdfleet-7d9f-abcde_")
    assert first != second  # a restarted process is a new candidate
