"""The chart's admission warnings: a ValidatingAdmissionPolicy generated from the patch catalogue that warns, never
refuses, when a pool opts out of recommended fixes. Rendered by the real helm, offline; the real apiserver runs
it in tests/integration/test_verified_rollout_e2e.py (the warning kubectl prints, the policy's type check)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pdfleet.operator.api import admission_warnings
from pdfleet.runtime.patches import catalogue
from tests.unit.test_chart import documents, of_kind, one, template

ROOT = Path(__file__).resolve().parents[2]
SERVED = ("--api-versions", admission_warnings.VAP_API)  # what helm learns from a cluster that serves policies


def warning_docs(values: dict[str, object], extra: tuple[str, ...] = SERVED) -> list[dict[str, object]]:
    """The chart's documents of the warn-only policy (the pool policy's are tests/unit/test_pool_policy.py's)."""
    return [d for d in documents(template(values, extra=extra).stdout)
            if d["metadata"]["name"].endswith("-pool-warnings")]


def test_the_chart_s_policy_is_the_one_the_catalogue_generates() -> None:
    assert (ROOT / admission_warnings.OUTPUT).read_text() == admission_warnings.render(), \
        "charts/pdfleet/templates/admission-warnings.yaml is stale: run `make crds`"


def test_the_recommended_map_is_the_catalogue_s_for_every_release_an_engine_can_start() -> None:
    policy = one(warning_docs({}), "ValidatingAdmissionPolicy")
    [release_map] = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "recommendedByRelease"]
    assert json.loads(release_map) == {v: list(catalogue.recommended_for(v)) for v in catalogue.INSTRUMENTED}
    assert "grammar-consensus" in json.loads(release_map)["0.5.23"]


def test_it_only_warns_and_a_failure_to_evaluate_admits_the_pool() -> None:
    docs = warning_docs({})
    policy, binding = one(docs, "ValidatingAdmissionPolicy"), one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["validationActions"] == ["Warn"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert policy["spec"]["failurePolicy"] == "Ignore"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["pdfleet.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
        "resources": ["inferencepools"]}]
    assert "matchResources" not in binding["spec"], "cluster-wide release: every namespace"


def test_a_namespaced_release_warns_in_its_namespaces_only() -> None:
    binding = one(warning_docs({"watchNamespaces": ["team-a", "team-b"]}), "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}


def test_nothing_is_rendered_when_disabled_or_when_the_cluster_serves_no_admission_policies() -> None:
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    for docs in (warning_docs({"admissionWarnings": {"enabled": False}}), warning_docs({}, extra=())):
        assert not [d for kind in kinds for d in of_kind(docs, kind)]


def test_check_names_the_command_that_regenerates_a_stale_file(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "admission-warnings.yaml"
    stale.write_text("stale")
    assert admission_warnings.main(["--check", "--output", str(stale)]) == 1
    assert "make crds" in capsys.readouterr().err
    assert admission_warnings.main(["--output", str(stale)]) == 0
    assert admission_warnings.main(["--check", "--output", str(stale)]) == 0


def test_credential_like_names_are_matched_as_the_warning_means() -> None:
    pattern = re.compile(admission_warnings.CREDENTIAL_NAME)  # RE2's syntax here is Python's too
    assert all(pattern.search(n) for n in ("HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "db_password"))
    assert not any(pattern.search(n) for n in ("SGLANG_LOG_LEVEL", "NCCL_DEBUG", "HF_HUB_OFFLINE"))
    policy = one(warning_docs({}), "ValidatingAdmissionPolicy")
    for variable, section in admission_warnings.ENV_LISTS.items():
        [checked] = [v for v in policy["spec"]["validations"] if variable in v["expression"]]
        assert checked["messageExpression"].startswith(f"'spec.{section}.env: '")
        [listed] = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == variable]
        assert f"object.spec.{section}.env.filter" in listed
