"""The ToolCallIntegrity condition: which builds can leak DSML tool calls into text through SGLang's batch
decode, and what protects them. Pure: from the spec alone, through `reconcile.plan` for the condition and
its Warning."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.planning.rollout import toolcall_integrity
from pdfleet.runtime.patches import catalogue
from tests.support.pools import pool_body
from tests.unit.test_planning import FakeCluster

V32 = {"toolCallParser": "deepseekv32"}


def spec(version: str, *, model: dict[str, Any] | None = None, **engine: Any) -> InferencePoolSpec:
    body = pool_body()["spec"]
    body["model"].update(model or {})
    body["engine"].update(sglangVersion=version, **engine)
    return InferencePoolSpec.model_validate(body)


@pytest.mark.parametrize(("version", "model", "engine", "status", "reason"), [
    ("0.5.6.post2", {}, {}, "True", "NoDSMLParser"),
    ("0.5.6.post2", V32, {}, "False", "BatchDecodeLeak"),
    ("0.5.7", {"toolCallParser": "deepseekv4"}, {}, "False", "BatchDecodeLeak"),
    ("0.5.6.post2", V32, {"patches": ["dsml-batch-decode-guard"]}, "True", "Patched"),
    ("0.5.6.post2", V32, {"tokenizerBatchDecode": "Disabled"}, "True", "BatchDecodeDisabled"),
    ("0.5.8", V32, {}, "True", "NotAffected"),
    ("0.5.23", V32, {}, "True", "NotAffected"),
])
def test_which_builds_can_leak_tool_calls_through_batch_decode(version: str, model: dict[str, Any],
                                                              engine: dict[str, Any], status: str,
                                                              reason: str) -> None:
    judged = toolcall_integrity.judge(spec(version, model=model, **engine))
    assert (str(judged.status), judged.reason) == (status, reason)


def test_an_exposed_pool_says_so_in_a_condition_and_one_warning_naming_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Admission refuses releases the runtime does not instrument (0.5.23 only today): as if it did 0.5.6.post2.
    monkeypatch.setattr(catalogue, "INSTRUMENTED", (*catalogue.INSTRUMENTED, "0.5.6.post2"))
    body = pool_body()
    body["spec"]["model"].update(V32)
    body["spec"]["engine"]["sglangVersion"] = "0.5.6.post2"
    # At its defaults the pool runs the guard, a recommended fix on this release.
    defaults = FakeCluster(copy.deepcopy(body))
    defaults.converge()
    condition = next(c for c in defaults.pool["status"]["conditions"] if c["type"] == "ToolCallIntegrity")
    assert (condition["status"], condition["reason"]) == ("True", "Patched")
    body["spec"]["engine"]["patchPolicy"] = "Explicit"
    cluster = FakeCluster(body)
    plans = cluster.converge()
    condition = next(c for c in cluster.pool["status"]["conditions"] if c["type"] == "ToolCallIntegrity")
    assert (condition["status"], condition["reason"]) == ("False", "BatchDecodeLeak")
    assert "add dsml-batch-decode-guard to spec.engine.patches" in condition["message"]
    warnings = [e for p in plans for e in p.events if e.reason == "ToolCallLeakRisk"]
    assert len(warnings) == 1 and warnings[0].type == "Warning"
    # The pool still serves: a risk to know of, not a reason to stop.
    assert cluster.pool["status"]["phase"] == "Ready"
