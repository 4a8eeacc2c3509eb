"""The API models in Python: defaults, the wire form, durations, status helpers and Python-only checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from pdfleet.operator.api import (
    Condition,
    ConditionStatus,
    InferencePool,
    InferencePoolSpec,
    Role,
    RoleStatus,
    Switch,
    validate,
)
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.runtime.patches import catalogue, registry
from tests.unit.test_api_rejections import merged, minimal_spec

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_defaults_fill_every_omitted_section() -> None:
    spec = InferencePoolSpec.model_validate(minimal_spec())
    assert spec.router.replicas == 2
    assert spec.engine.overlap_schedule is Switch.ENABLED
    assert spec.prefill.bootstrap_port == 8998
    assert spec.health.hang_after == "10m"
    assert spec.rollout.order == "DecodeFirst"
    assert spec.engine.extra_args == ()
    assert spec.engine.patches == ()


def test_models_are_frozen() -> None:
    spec = InferencePoolSpec.model_validate(minimal_spec())
    with pytest.raises(ValidationError):
        spec.paused = True  # type: ignore[misc]


def test_python_names_and_wire_names_both_validate() -> None:
    spec = InferencePoolSpec.model_validate(minimal_spec())
    again = InferencePoolSpec(**{name: getattr(spec, name) for name in InferencePoolSpec.model_fields})
    assert again == spec


def test_the_wire_form_uses_camel_case_and_omits_unset_optionals() -> None:
    wire = InferencePoolSpec.model_validate(minimal_spec()).model_dump(mode="json")
    assert wire["model"] == {"servedName": "tiny", "source": {"path": "/models/tiny"},
                             "trustRemoteCode": False}
    assert "extraArgs" not in wire["engine"]
    assert "toolCallParser" not in wire["model"]
    assert wire["prefill"]["bootstrapPort"] == 8998


def test_the_wire_form_validates_back_to_the_same_spec() -> None:
    spec = InferencePoolSpec.model_validate(merged(minimal_spec(), {
        "engine": {"extraArgs": ["--mem-fraction-static", "0.8"], "patches": ["abort-consensus"],
                   "env": [{"name": "A", "value": "1"}]}}))
    assert InferencePoolSpec.model_validate(spec.model_dump(mode="json")) == spec


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_accepted(path: Path) -> None:
    body = yaml.safe_load(path.read_text())
    assert validate(body) == []
    pool = InferencePool.model_validate(body)
    assert pool.kind == "InferencePool"
    assert pool.api_version == "pdfleet.dev/v1alpha1"


@pytest.mark.parametrize(("text", "expected"), [
    ("30s", timedelta(seconds=30)),
    ("5m", timedelta(minutes=5)),
    ("1h30m", timedelta(hours=1, minutes=30)),
    ("250ms", timedelta(milliseconds=250)),
])
def test_durations_parse_like_go_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "5", "1d", "1.5s", "-5s", "5 m", "m5"])
def test_durations_outside_the_pattern_do_not_parse(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_a_catalogued_patch_marked_unavailable_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    # No patch is unavailable today; the mechanism stays for a known fix whose implementation is not ready.
    monkeypatch.setattr(catalogue, "UNAVAILABLE", {"bf16-index-keys": "its kernels are being verified"})
    spec = merged(minimal_spec(), {"engine": {"patches": ["abort-consensus", "bf16-index-keys"]}})
    [problem] = validate({"spec": spec})
    assert problem.path == "spec.engine.patches[1]"
    assert problem.message == "patch bf16-index-keys is not implemented by pdfleet yet: its kernels are being verified"


def test_bf16_index_keys_is_admitted_for_the_releases_it_was_checked_against() -> None:
    spec = merged(minimal_spec(), {"engine": {"patches": ["bf16-index-keys"]}})
    assert validate({"spec": spec}) == []
    problems = validate({"spec": merged(spec, {"engine": {"sglangVersion": "0.5.22"}})})
    assert any(p.path == "spec.engine.patches[0]" and ">=0.5.23,<0.6.0" in p.message for p in problems)


def test_every_available_patch_has_an_implementation_and_only_those() -> None:
    assert set(registry.MODULES) == set(catalogue.IDS) - set(catalogue.UNAVAILABLE)


def test_a_patch_fixed_upstream_is_refused_as_redundant() -> None:
    spec = merged(minimal_spec(), {"engine": {"patches": ["abort-consensus", "dsml-batch-decode-guard"]}})
    [problem] = validate({"spec": spec})
    assert problem.path == "spec.engine.patches[1]"
    assert problem.message == ("patch dsml-batch-decode-guard is fixed upstream in SGLang 0.5.8; "
                               "sglangVersion 0.5.23 does not need it, remove it")


@pytest.mark.effect("spec.engine.sglangVersion")
def test_a_patch_for_another_sglang_version_is_refused() -> None:
    spec = merged(minimal_spec(), {"engine": {"sglangVersion": "0.4.9", "patches": ["kv-poll-lockstep"]}})
    problems = {p.path: p.message for p in validate({"spec": spec})}
    assert problems.keys() == {"spec.engine.sglangVersion", "spec.engine.patches[0]"}
    assert "applies to SGLang >=0.5.0,<0.6.0, not to sglangVersion 0.4.9" in problems["spec.engine.patches[0]"]


@pytest.mark.effect("spec.engine.sglangVersion")
@pytest.mark.parametrize("version", ["0.5.22", "0.5.24", "0.6.0rc1"])
def test_a_release_the_runtime_does_not_instrument_is_refused_at_admission(version: str) -> None:
    # Its engines would refuse to start (the rank-health seams are fingerprinted per release): say so up front.
    [problem] = validate({"spec": merged(minimal_spec(), {"engine": {"sglangVersion": version}})})
    assert problem.path == "spec.engine.sglangVersion"
    assert problem.message == (f"pdfleet's runtime instruments SGLang 0.5.23 only (its rank-health seams are "
                               f"checked against each release's code): an engine of SGLang {version} would refuse "
                               "to start")


@pytest.mark.effect("spec.engine.sglangVersion")
@pytest.mark.parametrize("version", ["0.5.0", "0.5.6.post2", "0.5.7"])
def test_an_older_sglang_may_use_the_patch_upstream_fixed_later(version: str) -> None:
    spec = merged(minimal_spec(), {"engine": {"sglangVersion": version, "patches": ["dsml-batch-decode-guard"]}})
    # The patch applies; only the release itself is refused, until the runtime instruments it.
    assert [p.path for p in validate({"spec": spec})] == ["spec.engine.sglangVersion"]


def test_validate_reports_a_missing_spec_instead_of_raising() -> None:
    problems = validate({})
    assert {p.path for p in problems} >= {"spec.model", "spec.engine", "spec.prefill", "spec.decode"}


def test_role_status_summary_reads_ready_over_desired() -> None:
    status = RoleStatus.of(desired=3, ready=2, updated=1)
    assert status.summary == "2/3"
    assert status.model_dump(mode="json") == {"desired": 3, "ready": 2, "updated": 1, "summary": "2/3"}


def test_conditions_serialise_as_metav1_conditions() -> None:
    condition = Condition(type="Ready", status=ConditionStatus.TRUE, reason="AllGroupsReady",
                          last_transition_time=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC), observed_generation=4)
    assert condition.model_dump(mode="json") == {
        "type": "Ready", "status": "True", "observedGeneration": 4, "lastTransitionTime": "2025-01-02T03:04:05Z",
        "reason": "AllGroupsReady", "message": "",
    }


def test_spec_role_returns_the_role_section() -> None:
    spec = InferencePoolSpec.model_validate(merged(minimal_spec(), {"decode": {"replicas": 3}}))
    assert spec.role(Role.DECODE).replicas == 3
    assert spec.role(Role.PREFILL) is spec.prefill
