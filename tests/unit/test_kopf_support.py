"""The operator starts only on a kopf its fixes to kopf's internals were written for (operator/kopf_support.py).

Another version is refused by its number, before any fix is installed; a supported version whose patched functions
are not the code the fixes were written against is refused by their fingerprints. The end-to-end check runs the
installed `pdfleet-operator` with a kopf distribution of another version first on its path."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from kopf._core.reactor import queueing
from packaging.requirements import Requirement

from pdfleet.operator import __main__ as operator_main
from pdfleet.operator import kopf_fixes, kopf_support

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_kopf_is_the_supported_1_45_2_and_accepted() -> None:
    assert kopf_support.installed_version() == "1.45.2"
    assert "1.45.2" in kopf_support.SUPPORTED
    assert kopf_support.problem() is None
    kopf_support.require()


def test_every_supported_version_fingerprints_every_target() -> None:
    for version, fingerprints in kopf_support.SUPPORTED.items():
        assert set(fingerprints) == set(kopf_support.TARGETS), version


def test_another_version_is_refused_with_what_is_installed_what_was_supported_and_what_to_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf_support, "installed_version", lambda: "1.46.0")
    why = kopf_support.problem()
    assert why is not None
    assert "kopf 1.46.0 is installed" in why
    assert "written for kopf 1.45.2" in why
    assert "pip install 'kopf==1.45.2'" in why
    assert "add it to SUPPORTED in operator/kopf_support.py" in why
    with pytest.raises(kopf_support.UnsupportedKopf, match=r"kopf 1\.46\.0 is installed"):
        kopf_support.require()


def test_no_kopf_at_all_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf_support, "installed_version", lambda: None)
    assert (kopf_support.problem() or "").startswith("kopf is not installed; the operator was written for kopf 1.45.2")


def test_the_fixes_install_nothing_on_another_version(monkeypatch: pytest.MonkeyPatch) -> None:
    original = getattr(queueing.watcher, "__wrapped__", queueing.watcher)
    monkeypatch.setattr(queueing, "watcher", original)
    monkeypatch.setattr(queueing, "worker", getattr(queueing.worker, "__wrapped__", queueing.worker))
    monkeypatch.setattr(kopf_support, "installed_version", lambda: "1.44.0")
    with pytest.raises(kopf_support.UnsupportedKopf, match=r"kopf 1\.44\.0 is installed"):
        kopf_fixes.install()
    assert queueing.watcher is original


def test_a_patched_function_that_changed_is_refused_by_its_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    async def worker(*args: object, **kwargs: object) -> None:  # what a distribution's patched kopf might carry
        return None

    monkeypatch.setattr(queueing, "worker", worker)
    why = kopf_support.problem()
    assert why is not None
    assert "kopf 1.45.2 is installed, but its code is not the kopf 1.45.2" in why
    assert f"{kopf_support.WORKER} (fingerprint " in why
    assert kopf_support.WATCHER not in why  # only what changed is named
    with pytest.raises(kopf_support.UnsupportedKopf):
        kopf_fixes.install()
    assert queueing.worker is worker


def test_a_target_that_is_gone_is_refused_with_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = "kopf._core.reactor.nowhere.watcher"
    monkeypatch.setitem(kopf_support.SUPPORTED, "1.45.2", {gone: "0" * 16})
    assert gone in (kopf_support.problem() or "")


def test_main_refuses_before_reading_its_arguments(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(kopf_support, "installed_version", lambda: "2.0.0")
    assert operator_main.main(["--no-such-flag"]) == operator_main.EXIT_UNSUPPORTED_KOPF
    err = capsys.readouterr().err
    assert err.startswith("pdfleet-operator: refusing to start: kopf 2.0.0 is installed")
    assert err.count("\n") == 1  # one message, no traceback


def test_the_check_is_cheap() -> None:
    kopf_support.problem()  # kopf's modules imported
    start = time.perf_counter()
    assert kopf_support.problem() is None
    assert time.perf_counter() - start < 0.5


def test_the_kopf_pyproject_allows_is_one_the_operator_supports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    kopf = [Requirement(r) for r in project["optional-dependencies"]["operator"] if Requirement(r).name == "kopf"]
    assert len(kopf) == 1
    assert list(kopf[0].specifier.filter(kopf_support.SUPPORTED)), \
        f"pyproject.toml asks for {kopf[0]}, and the operator supports only kopf {', '.join(kopf_support.SUPPORTED)}"


def test_pdfleet_operator_exits_non_zero_with_the_message_on_another_kopf(tmp_path: Path) -> None:
    """The installed console script, with a kopf 1.46.0 distribution found first: exit 2, one line, no traceback,
    and nothing started (the metrics and health ports are never bound: the arguments are not even read)."""
    dist = tmp_path / "kopf-1.46.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kopf\nVersion: 1.46.0\n")
    script = Path(sys.executable).parent / "pdfleet-operator"
    assert script.exists(), f"{script}: the package is not installed in this environment (pip install -e '.[dev]')"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([str(script), "--all-namespaces"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == operator_main.EXIT_UNSUPPORTED_KOPF, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "pdfleet-operator: refusing to start: kopf 1.46.0 is installed, but the operator's fixes to kopf's internals "
        "(operator/kopf_fixes.py, operator/kopf_watch.py) were written for kopf 1.45.2. Install kopf==1.45.2 "
        "(`pip install 'kopf==1.45.2'`), or check the fixes against kopf 1.46.0 and add it to SUPPORTED in "
        "operator/kopf_support.py (its docstring says how)."]
