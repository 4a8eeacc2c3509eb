"""End to end: the toolCallCanary verification gate on the local cluster. The operator runs the canary at the new
decode group's leader, paired with the Ready prefill engine as the router pairs them (the simulated decode engine
fetches the prefill's KV by bootstrap room), and judges its answers.

A leaking engine comes the way a new revision would bring one: `PDFLEET_SIM_FAULT=leak-parser-off` in
`spec.engine.env` is part of the revision, so only the replacing pods leak tool calls into content
(docs/local-fleet.md). One prefill and one decode group keep the run short.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

POOL = "canary"


def status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return fleet.pool(cluster, namespace, POOL).get("status") or {}


def gates(now: dict[str, Any], role: str) -> dict[str, dict[str, Any]]:
    [group] = [g for g in now["groups"] if g["role"] == role]
    return {g["name"]: g for g in (group.get("verification") or {}).get("gates", [])}


def test_the_tool_call_canary_gate_passes_healthy_engines_and_holds_a_rollout_to_leaking_ones(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL, model={"toolCallParser": "deepseekv32"},
                     prefill={"replicas": 1, "tp": 1, "gpusPerNode": 1},
                     decode={"replicas": 1, "tp": 1, "gpusPerNode": 1},
                     rollout={"verification": {"toolCallCanary": True}})

    def verified() -> dict[str, Any] | None:
        now = status(cluster, namespace)
        cond = fleet.conditions_of(now).get("RolloutVerified") or {}
        return now if cond.get("status") == "True" and now.get("currentRevision") == now.get("updateRevision") \
            else None
    first = wait_for("the pool verified with the canary gate on", verified, timeout=180, interval=0.5)
    decode, prefill = gates(first, "decode")["toolCallCanary"], gates(first, "prefill")["toolCallCanary"]
    assert decode["state"] == "Passed", decode
    assert "4 tool request(s) answered with structured tool_calls, no DSML markup in 10 answer(s); 2 answer(s) cut " \
           "inside the call by max_tokens 2, kept to the contract" in decode["message"]
    assert f"paired with prefill {POOL}-prefill-0-0" in decode["message"]
    assert prefill["state"] == "Skipped" and prefill["message"].startswith("does not apply to prefill groups")

    cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge", "-p", json.dumps(
        {"spec": {"engine": {"env": [{"name": "PDFLEET_SIM_FAULT", "value": "leak-parser-off"}]}}}))

    def failed() -> dict[str, Any] | None:
        cond = fleet.conditions(cluster, namespace, POOL).get("RolloutVerified") or {}
        return cond if cond.get("status") == "False" else None
    cond = wait_for("RolloutVerified False", failed, timeout=180, interval=0.5)
    assert cond["reason"] == "GateFailed"
    assert f"gate toolCallCanary failed for decode group {POOL}-decode-0" in cond["message"], cond["message"]
    assert "DSML markup in content (parser-off) in 4 answer(s)" in cond["message"], cond["message"]
    now = status(cluster, namespace)
    assert now["phase"] == "Failed"
    assert now["currentRevision"] == first["currentRevision"], "currentRevision stays at the last verified one"
    gate = gates(now, "decode")["toolCallCanary"]
    assert gate["state"] == "Failed" and "sample (parser-off): '<｜DSML｜function_calls>" in gate["message"]
    wait_for("one RolloutGateFailed Warning",
             lambda: len(fleet.events(cluster, namespace, POOL, "RolloutGateFailed")) == 1, timeout=30)
    [warning] = fleet.events(cluster, namespace, POOL, "RolloutGateFailed")
    assert "toolCallCanary" in warning["message"]
