"""Rows of docs/desync-audit.md's "Reachable collectives" that the call-following scan reaches but that cannot
diverge, shown on SGLang 0.5.23's own code.

- The decode offload manager's all-reduces from `Scheduler.pause_generation` (retract mode): entered by every
  rank whatever its running batch and waiting queue hold, on a real gloo group of 2 and 3 ranks
  (tests/repro/pause.py).
- `get_available_gpu_memory`'s all-reduce from `Scheduler.handle_pd_role_switch`: the role switch asks for this
  rank's free memory with `distributed` left False, so the all-reduce is never entered from there.
"""

from __future__ import annotations

import inspect
import json
from types import SimpleNamespace
from typing import Any

import pytest

from tests.repro import pause
from tests.support import requires
from tests.unit.test_desync_reproduction import Launch, _log


@pytest.mark.parametrize("world", [2, 3])
def test_pause_generation_enters_the_offload_drain_on_every_rank_whatever_each_rank_holds(
        launch: Launch, world: int) -> None:
    requires.installed("sglang")
    sc, proc = launch((), world, module="tests.repro.pause", arrivals={}, local_aborts={})
    assert proc.wait(timeout=180) == 0, f"a rank hung or failed in pause_generation:\n{_log(sc)}"
    results = [json.loads(sc.result_path(rank).read_text()) for rank in range(world)]
    # check_offload_progress's MIN and drain_before_retraction's MAX, once each, on every rank.
    assert [r["all_reduces"] for r in results] == [2] * world
    assert results[0]["retracted"] == results[0]["held"] == [f"run-{i}" for i in range(pause.RUNNING)]
    assert results[-1]["retracted"] == ["staged"], "the last rank's own state differs from rank 0's"
    assert all(r["paused"] for r in results)


def test_the_role_switch_reads_this_ranks_free_memory_without_a_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's own `handle_pd_role_switch`, to the end of its decode-graph headroom check (`prepare_only`), with
    any all-reduce failing the test: the memory is read with `distributed=False` (the default)."""
    requires.installed("sglang")
    import torch.distributed as dist
    from sglang.srt.disaggregation import role_switch
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.io_struct import PdRoleSwitchReqInput
    from sglang.srt.utils import common

    def all_reduce(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the role switch entered an all-reduce")

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(role_switch, "get_device", lambda: SimpleNamespace(gpu_id=0))  # the published device
    scheduler = SimpleNamespace(
        disaggregation_mode=DisaggregationMode.PREFILL, server_args=SimpleNamespace(enable_pd_role_switch=True),
        _pd_role_switch_unhealthy=False, _pd_role_switch_in_progress=False, disagg_prefill_bootstrap_queue=None,
        is_fully_idle=lambda: True, device="cpu",
        tp_worker=SimpleNamespace(get_decode_cuda_graph_bs=lambda: []),  # decode graphs still to capture
    )
    ready = role_switch.handle_pd_role_switch(scheduler, PdRoleSwitchReqInput(
        new_role="decode", decode_cuda_graph_memory_gb=0.0, prepare_only=True))
    assert (ready.success, ready.message) == (True, "ready")
    short = role_switch.handle_pd_role_switch(scheduler, PdRoleSwitchReqInput(
        new_role="decode", decode_cuda_graph_memory_gb=1e9, prepare_only=True))
    assert not short.success and short.message.startswith("insufficient decode CUDA graph headroom")
    assert inspect.signature(common.get_available_gpu_memory).parameters["distributed"].default is False
    assert "get_available_gpu_memory(\n                scheduler.device, get_device().gpu_id\n            )" in \
        inspect.getsource(role_switch.handle_pd_role_switch)


def test_the_role_switch_is_off_on_every_pdfleet_engine_so_no_rank_decides_one() -> None:
    """The role switch's own decision (idle, the headroom above, caught exceptions) is taken per rank with no
    agreement, and a rank that switches alone runs the other role's loop. pdfleet refuses
    `--enable-pd-role-switch` in extraArgs (and any abbreviation SGLang's parser would take for it) and never
    renders it; without it SGLang's own handler rejects every switch request before any per-rank check."""
    requires.installed("sglang")
    from sglang.srt.disaggregation import role_switch
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.io_struct import PdRoleSwitchReqInput
    from sglang.srt.server_args import prepare_server_args

    from pdfleet.operator.api import validate
    from tests.unit.test_api_rejections import merged, minimal_spec

    base = ["--model-path", "/models/tiny", "--disaggregation-mode", "decode"]
    assert prepare_server_args(base).enable_pd_role_switch is False  # SGLang's default
    for spelling in ("--enable-pd-role-switch", "--enable-pd-role"):  # argparse takes the prefix for the flag
        assert prepare_server_args([*base, spelling]).enable_pd_role_switch is True
        problems = validate({"spec": merged(minimal_spec(), {"engine": {"extraArgs": [spelling]}})})
        assert [(p.path, "--enable-pd-role-switch" in p.message) for p in problems] == \
            [("spec.engine.extraArgs[0]", True)], problems

    def not_reached() -> bool:
        raise AssertionError("a per-rank role-switch check ran without --enable-pd-role-switch")

    scheduler = SimpleNamespace(
        disaggregation_mode=DisaggregationMode.DECODE, server_args=SimpleNamespace(enable_pd_role_switch=False),
        _pd_role_switch_unhealthy=False, _pd_role_switch_in_progress=False, disagg_decode_prealloc_queue=None,
        is_fully_idle=not_reached)
    refused = role_switch.handle_pd_role_switch(scheduler, PdRoleSwitchReqInput(new_role="prefill"))
    assert (refused.success, refused.message) == (False, "--enable-pd-role-switch is not set on this instance")
