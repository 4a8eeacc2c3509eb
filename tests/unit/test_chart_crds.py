"""The chart ships exactly the generated CRDs of crds/, and hack/sync-chart-crds.py keeps it so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.unit.test_chart import CHART, documents, template

ROOT = Path(__file__).resolve().parents[2]
SYNC = ROOT / "hack" / "sync-chart-crds.py"
CRD = "inferencepools.pdfleet.dev.yaml"
GENERATE = "python -m pdfleet.operator.api.crd"


def sync(*args: str, root: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--root", str(root)] if root else []
    return subprocess.run([sys.executable, str(SYNC), *args, *extra], text=True, capture_output=True, timeout=60)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository layout with a generated CRD in crds/ and an empty chart."""
    (tmp_path / "crds").mkdir()
    (tmp_path / "crds" / CRD).write_text("kind: CustomResourceDefinition\n")
    (tmp_path / "charts" / "pdfleet").mkdir(parents=True)
    return tmp_path


def require_generated_crd() -> None:
    if not (ROOT / "crds" / CRD).is_file():
        pytest.fail(f"crds/{CRD} does not exist: generate it with `{GENERATE}`, then run "
                    "`python hack/sync-chart-crds.py`", pytrace=False)


def test_the_chart_ships_the_same_crds_as_the_crds_folder() -> None:
    require_generated_crd()
    result = sync("--check")
    if result.returncode != 0:
        pytest.fail(result.stderr, pytrace=False)


def test_helm_installs_the_inference_pool_crd_with_the_short_name_the_notes_use() -> None:
    require_generated_crd()
    assert (CHART / "crds" / CRD).is_file(), "run `python hack/sync-chart-crds.py`"
    crds = [d for d in documents(template({"operator": {"enabled": False}}, extra=("--include-crds",)).stdout)
            if d["kind"] == "CustomResourceDefinition"]
    by_name = {c["metadata"]["name"]: c for c in crds}
    assert sorted(by_name) == ["inferencepoolroles.pdfleet.dev", "inferencepools.pdfleet.dev"]
    pool = by_name["inferencepools.pdfleet.dev"]
    assert "pdpool" in pool["spec"]["names"]["shortNames"]
    assert pool["spec"]["scope"] == "Namespaced"
    assert yaml.safe_load((ROOT / "crds" / CRD).read_text()) == pool
    role = by_name["inferencepoolroles.pdfleet.dev"]
    assert role["spec"]["versions"][0]["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"


def test_syncing_copies_new_and_changed_crds_and_removes_stale_ones(repo: Path) -> None:
    chart_crds = repo / "charts" / "pdfleet" / "crds"
    first = sync(root=repo)
    assert first.returncode == 0, first.stderr
    assert (chart_crds / CRD).read_bytes() == (repo / "crds" / CRD).read_bytes()

    (repo / "crds" / CRD).write_text("kind: CustomResourceDefinition\nspec: {}\n")
    (chart_crds / "gone.pdfleet.dev.yaml").write_text("kind: CustomResourceDefinition\n")
    second = sync(root=repo)
    assert second.returncode == 0, second.stderr
    assert sorted(p.name for p in chart_crds.iterdir()) == [CRD]
    assert (chart_crds / CRD).read_bytes() == (repo / "crds" / CRD).read_bytes()
    assert sync("--check", root=repo).returncode == 0


def test_a_drifted_chart_copy_fails_the_check_with_the_command_that_fixes_it(repo: Path) -> None:
    assert sync(root=repo).returncode == 0
    (repo / "charts" / "pdfleet" / "crds" / CRD).write_text("kind: CustomResourceDefinition\n# edited by hand\n")
    before = (repo / "charts" / "pdfleet" / "crds" / CRD).read_text()
    result = sync("--check", root=repo)
    assert result.returncode == 1
    assert f"charts/pdfleet/crds/{CRD} differs" in result.stderr
    assert "python hack/sync-chart-crds.py" in result.stderr
    assert (repo / "charts" / "pdfleet" / "crds" / CRD).read_text() == before, "--check must change nothing"


def test_a_missing_generated_crd_is_named_with_the_command_that_generates_it(repo: Path) -> None:
    (repo / "crds" / CRD).unlink()
    for args in ((), ("--check",)):
        result = sync(*args, root=repo)
        assert result.returncode == 1
        assert f"crds/{CRD} does not exist" in result.stderr
        assert GENERATE in result.stderr
        assert "Traceback" not in result.stderr
