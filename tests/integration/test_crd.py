"""The generated CRD on a real kube-apiserver: it installs, it keeps examples as written (plus defaults), it
refuses every invalid spec of the shared table with a message naming the field, and kubectl explains and
prints it.

The invalid-spec table is the one tests/unit/test_api_rejections.py runs against the Python models, so a rule
enforced on one side only fails here or there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet.operator.api import InferencePool, InferencePoolStatus, Phase, RoleStatus, crd, meta, names
from pdfleet.operator.api.conditions import Condition, ConditionStatus
from tests.support.cluster import Cluster, wait_for
from tests.unit.test_api_rejections import EDGE_SPECS, INVALID_SPECS, Case, merged, minimal_spec

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / crd.DEFAULT_OUTPUT
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    """The committed CRD, applied server-side and Established, with the resource served."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=pdfleet-tests",
                    "-f", str(CRD_FILE))
    cluster.wait_established(meta.CRD_NAME)
    wait_for("the inferencepools resource to be served",
             lambda: cluster.kubectl("get", "pdpool", "-A", check=False).returncode == 0)
    return cluster


def manifest(name: str, spec: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": meta.API_VERSION, "kind": meta.KIND, "metadata": {"name": name}, "spec": spec})


def test_the_crd_is_established_with_its_names_accepted(installed: Cluster) -> None:
    got = installed.get(f"crd/{meta.CRD_NAME}")
    conditions = {c["type"]: c["status"] for c in got["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    assert got["status"]["acceptedNames"]["shortNames"] == ["pdpool"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_reads_back_as_written_plus_the_defaults_python_expects(
        installed: Cluster, namespace: str, path: Path) -> None:
    body = yaml.safe_load(path.read_text())
    installed.kubectl("apply", "--server-side", "-n", namespace, "-f", str(path))
    stored = installed.get("pdpool", body["metadata"]["name"], "-n", namespace)
    expected = InferencePool.model_validate(body).spec.model_dump(mode="json")
    assert stored["spec"] == expected
    assert _contains(stored["spec"], body["spec"]), "the apiserver changed or pruned a field that was written"


def _contains(whole: Any, part: Any) -> bool:
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and _contains(whole[k], v) for k, v in part.items())
    return whole == part


@pytest.mark.parametrize("case", INVALID_SPECS, ids=lambda case: case.id)
def test_the_apiserver_refuses_the_spec_naming_the_field(installed: Cluster, namespace: str, case: Case) -> None:
    says = case.apiserver_says or case.says
    for dry_run in ((), ("--dry-run=server",)):
        proc = installed.kubectl("apply", *dry_run, "-n", namespace, "-f", "-",
                                 input=manifest("bad", case.spec), check=False)
        output = proc.stderr + proc.stdout
        assert proc.returncode != 0, f"accepted{' (dry run)' if dry_run else ''}: {output}"
        assert case.path in output, f"the refusal does not name {case.path}: {output}"
        assert says in output, f"the refusal does not say {says!r}: {output}"
    assert installed.kubectl("get", "pdpool", "bad", "-n", namespace, check=False).returncode != 0


@pytest.mark.parametrize("length", [names.MAX_LENGTH + 1, 60])
def test_a_name_too_long_to_derive_names_from_is_refused_naming_metadata_name_and_the_limit(
        installed: Cluster, namespace: str, length: int) -> None:
    name = "p" * length
    for dry_run in ((), ("--dry-run=server",)):
        proc = installed.kubectl("apply", *dry_run, "-n", namespace, "-f", "-", input=manifest(name, minimal_spec()),
                                 check=False)
        assert proc.returncode != 0, "accepted"
        assert f"metadata.name: must be at most {names.MAX_LENGTH} characters" in proc.stderr, proc.stderr
    assert installed.kubectl("get", "pdpool", name, "-n", namespace, check=False).returncode != 0


@pytest.mark.parametrize("name", ["1pool", "my.pool"])
def test_a_name_no_service_can_take_is_refused(installed: Cluster, namespace: str, name: str) -> None:
    proc = installed.kubectl("apply", "-n", namespace, "-f", "-", input=manifest(name, minimal_spec()), check=False)
    assert proc.returncode != 0 and "metadata.name: must start with a lowercase letter" in proc.stderr, proc.stderr


def test_a_name_at_the_limit_is_accepted_and_the_pool_stays_updatable(installed: Cluster, namespace: str) -> None:
    # The name rules run on create only: a pool is never blocked from updates (its finalizer's removal) by them.
    name = "p" * names.MAX_LENGTH
    installed.kubectl("apply", "-n", namespace, "-f", "-", input=manifest(name, minimal_spec()))
    installed.kubectl("label", "pdpool", name, "-n", namespace, "touched=yes")
    assert installed.get("pdpool", name, "-n", namespace)["metadata"]["labels"]["touched"] == "yes"


def test_the_minimal_spec_of_the_table_is_accepted(installed: Cluster, namespace: str) -> None:
    installed.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=manifest("ok", minimal_spec()))


@pytest.mark.parametrize(("what", "patch"), EDGE_SPECS, ids=[what for what, _ in EDGE_SPECS])
def test_an_edge_spec_is_accepted(installed: Cluster, namespace: str, what: str, patch: dict[str, Any]) -> None:
    installed.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                      input=manifest("edge", merged(minimal_spec(), patch)))


def test_kubectl_explain_prints_the_field_descriptions(installed: Cluster) -> None:
    def explained() -> str | None:
        proc = installed.kubectl("explain", "inferencepool.spec.engine", check=False)
        return proc.stdout if proc.returncode == 0 and "overlapSchedule" in proc.stdout else None

    text = wait_for("kubectl explain to know the InferencePool schema", explained, timeout=60)
    assert "The SGLang engine every group runs" in text
    assert "--disable-overlap-schedule" in text
    for field in ("image", "sglangVersion", "patches", "extraArgs", "env"):
        assert field in text


def test_kubectl_get_shows_the_printer_columns(installed: Cluster, namespace: str) -> None:
    installed.kubectl("apply", "--server-side", "-n", namespace, "-f", str(ROOT / "examples" / "minimal.yaml"))
    status = InferencePoolStatus(
        phase=Phase.READY, observed_generation=1, current_revision="abc123", update_revision="abc123",
        prefill=RoleStatus.of(desired=1, ready=1, updated=1), decode=RoleStatus.of(desired=1, ready=0, updated=1),
        conditions=(Condition(type="Ready", status=ConditionStatus.FALSE, reason="GroupsNotReady",
                              last_transition_time="2026-11-30T12:00:00Z"),
                    Condition(type="RolloutVerified", status=ConditionStatus.TRUE, reason="AllGroupsVerified",
                              last_transition_time="2026-11-30T12:00:00Z")),
    )
    installed.kubectl("patch", "pdpool", "tiny", "-n", namespace, "--subresource=status", "--type=merge",
                      "-p", json.dumps({"status": status.model_dump(mode="json")}))
    lines = installed.kubectl("get", "pdpool", "-n", namespace).stdout.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "PREFILL", "DECODE", "REVISION", "VERIFIED", "AGE"]
    assert lines[1].split()[:6] == ["tiny", "Ready", "1/1", "0/1", "abc123", "True"]
    wide = installed.kubectl("get", "pdpool", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "PHASE", "PREFILL", "DECODE", "REVISION", "VERIFIED", "UPDATE", "PAUSED",
                               "AGE"]


def test_the_status_the_operator_writes_is_accepted_and_kept_apart_from_the_spec(
        installed: Cluster, namespace: str) -> None:
    installed.kubectl("apply", "--server-side", "-n", namespace, "-f", str(ROOT / "examples" / "minimal.yaml"))
    written = InferencePoolStatus(phase=Phase.PROGRESSING).model_dump(mode="json")
    installed.kubectl("patch", "pdpool", "tiny", "-n", namespace, "--subresource=status", "--type=merge",
                      "-p", json.dumps({"status": written}))
    stored = installed.get("pdpool", "tiny", "-n", namespace)
    assert InferencePoolStatus.model_validate(stored["status"]).phase is Phase.PROGRESSING
    # A write to the main resource cannot change status: the status subresource owns it.
    installed.kubectl("patch", "pdpool", "tiny", "-n", namespace, "--type=merge",
                      "-p", json.dumps({"status": {"phase": "Failed"}}))
    assert installed.get("pdpool", "tiny", "-n", namespace)["status"]["phase"] == "Progressing"
