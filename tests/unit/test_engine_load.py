"""An engine's load from its /metrics (`planning.scale.engine_load`), and which groups count as a role's serving
capacity (`planning.scale.serving_groups`), pure."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.status import GroupStatus, Verdict
from pdfleet.operator.planning.scale import engine_load, serving_groups
from pdfleet.operator.planning.scale.engine_load import LoadSample
from pdfleet.operator.render import labels
from tests.support import sglang_metrics

SCHEDULER = 'model_name="tiny",engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
TOKENIZER = 'model_name="tiny",engine_type="decode"'


def text(queue: float = 3, running: float = 7, usage: float = 0.42, itl: tuple[float, float] = (1.5, 50),
         dp: int = 1) -> str:
    """/metrics as SGLang 0.5.23 writes it (the scheduler's gauges per rank, the tokenizer's histograms)."""
    lines = []
    for name, value, kind in (("num_queue_reqs", queue, "gauge"), ("num_running_reqs", running, "gauge"),
                              ("token_usage", usage, "gauge")):
        lines += [f"# HELP sglang:{name} x", f"# TYPE sglang:{name} {kind}"]
        lines += [f'sglang:{name}{{{SCHEDULER},dp_rank="{r}"}} {value}' for r in range(dp)]
    lines += ["# HELP sglang:inter_token_latency_seconds x", "# TYPE sglang:inter_token_latency_seconds histogram",
              f'sglang:inter_token_latency_seconds_bucket{{{TOKENIZER},le="+Inf"}} {itl[1]}',
              f"sglang:inter_token_latency_seconds_sum{{{TOKENIZER}}} {itl[0]}",
              f"sglang:inter_token_latency_seconds_count{{{TOKENIZER}}} {itl[1]}"]
    return "\n".join(lines) + "\n"


def test_the_names_read_are_what_sglang_declares() -> None:
    declared = sglang_metrics.declared()
    for name in ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"):
        assert declared[name].kind == "gauge", name
    for name in ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"):
        assert declared[name].kind == "histogram", name


def test_an_engines_gauges_and_counters() -> None:
    sample = engine_load.parse("uid-1", text())
    assert sample == LoadSample(pod="uid-1", queue=3, running=7, token_usage=0.42, itl_sum=1.5, itl_count=50)


def test_dp_ranks_add_their_queues_and_average_their_usage() -> None:
    sample = engine_load.parse("u", text(queue=2, running=5, usage=0.6, dp=4))
    assert sample is not None
    assert (sample.queue, sample.running) == (8, 20)
    assert sample.token_usage == pytest.approx(0.6)


@pytest.mark.parametrize("body", ["", "not metrics {", "# TYPE other gauge\nother 1\n"])
def test_no_load_from_what_is_not_an_engines_metrics(body: str) -> None:
    assert engine_load.parse("u", body) is None


def test_latency_is_the_growth_between_two_polls() -> None:
    before = engine_load.parse("u", text(itl=(1.5, 50)))
    now = engine_load.parse("u", text(itl=(3.5, 150)))
    assert now is not None
    load = engine_load.window(before, now)
    assert (load.itl_sum, load.itl_count) == pytest.approx((2.0, 100))  # 20 ms over the window, 30 ms lifetime
    assert engine_load.window(None, now).itl_count == 0  # the first poll of an engine has no window
    restarted = engine_load.window(now, engine_load.parse("u", text(itl=(0.1, 2))))  # type: ignore[arg-type]
    assert (restarted.itl_sum, restarted.itl_count) == (0, 0)
    other_pod = engine_load.window(LoadSample(pod="v"), now)
    assert other_pod.itl_count == 0


# ---- serving groups -----------------------------------------------------------------------------------------

def pod(group: str, revision: str = "r1", *, ready: bool = True, deleting: bool = False,
        role: Role = Role.DECODE) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{group}-0", "uid": f"uid-{group}",
                            "labels": {labels.GROUP: group, labels.ROLE: str(role), labels.REVISION: revision}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running", "podIP": "127.0.0.9",
                                         "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def status(name: str, verified: str | None = "r1") -> GroupStatus:
    return GroupStatus(name=name, role=Role.DECODE, revision="r1", verdict=Verdict.HEALTHY, verified_revision=verified)


def count(pods: dict[str, list[dict[str, Any]]], verdicts: dict[str, Verdict], statuses: list[GroupStatus],
          replicas: int = 3) -> serving_groups.Serving:
    return serving_groups.serving(Role.DECODE, replicas=replicas, nodes=1, revision="r1", pods=pods,
                                  verdicts=verdicts, statuses=statuses)


def test_only_ready_healthy_verified_groups_at_the_revision_count() -> None:
    groups = ["d0", "d1", "d2", "d3", "d4", "d5"]
    pods = {"d0": [pod("d0")], "d1": [pod("d1", ready=False)], "d2": [pod("d2", deleting=True)],
            "d3": [pod("d3", "r0")], "d4": [pod("d4")], "d5": [pod("d5")],
            "p0": [pod("p0", role=Role.PREFILL)]}
    verdicts = {g: Verdict.HEALTHY for g in groups} | {"d4": Verdict.DESYNC, "p0": Verdict.HEALTHY}
    statuses = [status(g, None if g == "d5" else "r1") for g in groups]  # d5 still baking
    got = count(pods, verdicts, statuses, replicas=6)
    assert got.groups == ("d0",) and not got.all_serving


def test_a_role_is_all_serving_only_with_exactly_replicas_groups_all_counted() -> None:
    pods = {g: [pod(g)] for g in ("d0", "d1", "d2")}
    verdicts = dict.fromkeys(pods, Verdict.HEALTHY)
    statuses = [status(g) for g in pods]
    assert count(pods, verdicts, statuses).all_serving
    assert not count(pods, verdicts, statuses, replicas=2).all_serving  # a surge group, or one being removed
    assert not count(pods, verdicts, statuses, replicas=4).all_serving  # one still to start
