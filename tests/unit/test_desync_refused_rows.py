"""Features docs/desync-audit.md settles by refusing their flags at admission, shown on SGLang 0.5.23's own code:
that the feature decides per TP rank what the group must agree, that its flags are the only way to turn it on,
and that pdfleet refuses each spelling SGLang's parser takes for them.

- LoRA (`--enable-lora`, `--lora-paths`): the batch preparation's all-gather (`LoRAManager.prepare_lora_batch`)
  is the row the scan reaches; the per-rank decisions are around it: a starving adapter's drain decided on each
  rank's own clock, an asynchronously copied adapter's readiness read from this rank's CUDA event (both inside
  batch admission, prefill and decode), and an adapter load's outcome, which only the TP leader reports.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import requires

_BASE = ["--model-path", "/models/tiny", "--disaggregation-mode", "decode"]


def _lora_enabled(argv: list[str]) -> bool:
    """Whether SGLang turns LoRA on for these arguments, as its own resolution step decides it."""
    from sglang.srt.arg_groups.lora_hook import check_lora_server_args
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args([*_BASE, *argv])
    check_lora_server_args(args)
    return bool(resolving_view(args).enable_lora)


def _refusals(extra_args: list[str]) -> list[tuple[str, str]]:
    from pdfleet.operator.api import validate
    from tests.unit.test_api_rejections import merged, minimal_spec

    problems = validate({"spec": merged(minimal_spec(), {"engine": {"extraArgs": extra_args}})})
    return [(p.path, p.message) for p in problems]


def test_lora_is_turned_on_only_by_the_flags_pdfleet_refuses() -> None:
    requires.installed("sglang")
    assert not _lora_enabled([])  # SGLang's default
    # The other LoRA flags, free in extraArgs, leave it off.
    others = ["--max-lora-rank", "8", "--lora-target-modules", "all", "--max-loaded-loras", "8",
              "--lora-drain-wait-threshold", "1", "--lora-eviction-policy", "fifo"]
    assert not _lora_enabled(others) and _refusals(others) == []
    # Every spelling that turns it on, abbreviations SGLang's argparse takes included, is refused by name.
    spellings = {"--enable-lora": ["--enable-lora", *others], "--lora-paths": ["--lora-paths", "a=/models/a"],
                 "--lora-p": ["--lora-p", "a=/models/a"], "--lora-pa=a=/models/a": ["--lora-pa=a=/models/a"]}
    for spelling, argv in spellings.items():
        assert _lora_enabled(argv), spelling
        flag = "--enable-lora" if spelling == "--enable-lora" else "--lora-paths"
        assert [(path, f"extraArgs may not set {flag}" in message) for path, message in _refusals([spelling])] == \
            [("spec.engine.extraArgs[0]", True)], spelling


def test_without_lora_no_manager_is_built_and_the_adapter_handlers_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch preparation's all-gather is reached only through `model_runner.lora_manager`, built only with
    LoRA on (or by UNO's draft, which loads its one adapter at start and does not support DP attention, without
    which the gather is not entered); SGLang's own load/unload handlers refuse before reaching any rank."""
    requires.installed("sglang")
    import asyncio

    from sglang.srt.lora.lora_manager import LoRAManager
    from sglang.srt.managers import tokenizer_control_mixin as control
    from sglang.srt.managers.io_struct import LoadLoRAAdapterReqInput, UnloadLoRAAdapterReqInput
    from sglang.srt.model_executor.model_runner import ModelRunner

    body = textwrap.dedent(inspect.getsource(ModelRunner.maybe_init_lora_manager))
    assert "if get_lora().enable_lora and not self.is_draft_worker:\n        self.init_lora_manager()" in body
    assert body.index("if self.spec_algorithm.is_uno():") < body.index("get_lora().enable_lora")
    prepare = inspect.getsource(LoRAManager.prepare_lora_batch)
    assert prepare.index("if self.attn_dp_enabled:") < prepare.index("all_gather_object(")

    monkeypatch.setattr(control, "get_lora", lambda: SimpleNamespace(enable_lora=None))
    manager = SimpleNamespace(auto_create_handle_loop=lambda: None)  # no rank is reached: nothing else is used
    for handler, request in ((control.TokenizerControlMixin.load_lora_adapter,
                              LoadLoRAAdapterReqInput(lora_name="a", lora_path="/models/a")),
                             (control.TokenizerControlMixin.unload_lora_adapter,
                              UnloadLoRAAdapterReqInput(lora_name="a"))):
        result = asyncio.run(handler(manager, request))
        assert not result.success and "LoRA is not enabled" in result.error_message, handler


def _waiting(lora_id: str, entered: float, max_new_tokens: int = 64) -> SimpleNamespace:
    return SimpleNamespace(lora_id=lora_id, time_stats=SimpleNamespace(wait_queue_entry_time=entered),
                           sampling_params=SimpleNamespace(max_new_tokens=max_new_tokens), output_ids=[])


def test_two_ranks_drain_a_lora_adapter_at_different_iterations_on_their_own_clocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's own LoRADrainer (`--lora-drain-wait-threshold`), as prefill admission and decode's prebuilt batch
    run it: each rank measures a waiting request's wait with its own `time.monotonic()` against the moment it
    queued the request. Two ranks holding the same queue, reading their clocks 1 ms apart around the threshold,
    disagree whether the running adapter drains, so one admits a request for it and the other does not."""
    requires.installed("sglang")
    from sglang.srt.lora import lora_drainer

    threshold, queued = 5.0, 100.0
    running = [SimpleNamespace(lora_id="A", sampling_params=SimpleNamespace(max_new_tokens=256), output_ids=[1])]
    clock = [0.0]
    monkeypatch.setattr(lora_drainer.time, "monotonic", lambda: clock[0])
    admits = []
    for now in (queued + threshold + 0.0005, queued + threshold - 0.0005):  # the same iteration on two ranks
        drainer = lora_drainer.LoRADrainer(max_loras_per_batch=1, max_wait_time_secs=threshold)
        clock[0] = now
        drainer.update_draining_state([_waiting("B", queued)], running)
        # A request for the running adapter, longer than a draining adapter may still take (255 tokens left).
        admits.append(drainer.can_schedule(_waiting("A", now, max_new_tokens=512)))
    assert admits == [False, True], "the first rank drains A for B, its peer still admits A"


def _calls(fn: Any) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


def test_lora_admission_reads_this_ranks_cuda_event_and_a_load_reports_this_ranks_outcome() -> None:
    """With overlap loading, admission's `can_schedule_lora_req` asks the overlap loader, which drains the copies
    whose CUDA event this rank sees completed (`event.query()`) before it answers LOADED or LOADING. A load is
    run on every rank from the broadcast, and `_load_lora_adapter` turns any exception into a failed result for
    this rank alone; only the TP leader has a socket to the tokenizer (the others' `SenderWrapper(None)`), whose
    registry then follows the leader's answer."""
    requires.installed("sglang")
    from sglang.srt.lora.lora_manager import LoRAManager
    from sglang.srt.lora.lora_overlap_loader import LoRAOverlapLoader
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components import ipc_channels

    assert "self.lora_overlap_loader.try_overlap_load_lora" in _calls(Scheduler.can_schedule_lora_req)
    assert "self._drain_completed_overlap_loads" in _calls(LoRAOverlapLoader.try_overlap_load_lora)
    assert "event.query" in _calls(LoRAOverlapLoader._drain_completed_overlap_loads)

    load = ast.parse(textwrap.dedent(inspect.getsource(LoRAManager._load_lora_adapter)))
    handlers = [h for n in ast.walk(load) if isinstance(n, ast.Try) for h in n.handlers]
    assert [ast.unparse(h.type) for h in handlers] == ["Exception"]
    assert "success=False" in ast.unparse(handlers[0])
    senders = inspect.getsource(ipc_channels)
    assert senders.count("send_to_tokenizer = SenderWrapper(None)") == 1
