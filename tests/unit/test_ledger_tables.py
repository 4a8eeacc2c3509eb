"""The fixed tables a record refers to: stable numbers, and no SGLang event loop left without one."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from pdfleet.runtime.health import phases
from tests.support import requires


def test_every_event_loop_of_the_installed_sglang_has_an_id() -> None:
    requires.installed("sglang")
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    srt = Path(next(iter(spec.submodule_search_locations))) / "srt"
    defined = {m for f in srt.rglob("*.py") for m in re.findall(r"def (event_loop_\w+)\(", f.read_text())}

    assert defined
    assert {m for m in defined if phases.LoopName.from_method(m) is phases.LoopName.UNKNOWN} == set()


def test_a_loop_name_this_table_does_not_know_is_unknown_not_an_error() -> None:
    assert phases.LoopName.from_method("event_loop_from_the_future") is phases.LoopName.UNKNOWN
    assert phases.LoopName(999) is phases.LoopName.UNKNOWN
    assert phases.Phase(999) is phases.Phase.UNKNOWN


def test_loop_and_phase_labels_round_trip() -> None:
    for loop in phases.LoopName:
        assert phases.loop_from_label(loop.method) is loop
    for phase in phases.Phase:
        assert phases.phase_from_label(phase.label) is phase


def test_the_numbers_on_the_wire_never_change() -> None:
    # Writers and readers run different pdfleet versions: append new values, never renumber.
    assert {p.name: p.value for p in phases.Phase} == {
        "UNKNOWN": 0,
        "STARTING": 1,
        "LOCAL": 2,
        "IDLE": 3,
        "FORWARD": 4,
        "EXITED": 5,
        "RECV_BROADCAST": 16,
        "KV_POLL_ALL_REDUCE": 17,
        "MLP_SYNC_ALL_GATHER": 18,
        "OTHER_COLLECTIVE": 19,
        "PREALLOC_HANDSHAKE_POLL": 20,
        "DECODE_TRANSFER_POLL": 21,
        "PREFILL_BOOTSTRAP_POLL": 22,
        "PREFILL_INFLIGHT_POLL": 23,
        "PREFILL_WAITING_BOOTSTRAP_POLL": 24,
        "PREFILL_CHUNK_BOOTSTRAP_POLL": 25,
        "RETRACTION_AGREEMENT": 26,
        "PREALLOC_HANDSHAKE_EXCHANGE": 27,
        "DECODE_TRANSFER_EXCHANGE": 28,
        "PREFILL_BOOTSTRAP_EXCHANGE": 29,
        "PREFILL_INFLIGHT_EXCHANGE": 30,
        "FAILED_TRANSFER_FLAGS": 31,
        "DEFERRED_RELEASE_FLAGS": 32,
        "KV_CHECKSUM_FLAGS": 33,
        "PREFILL_WAITING_BOOTSTRAP_EXCHANGE": 34,
        "PREFILL_CHUNK_BOOTSTRAP_EXCHANGE": 35,
        "HEALTH_CHECK_AGREEMENT": 36,
        "DECODE_MEMORY_AGREEMENT": 37,
        "OFFLOAD_RETRACTION_DRAIN": 38,
        "OFFLOAD_PROGRESS": 39,
        "ADMISSION_AGREEMENT": 40,
        "GRAMMAR_READY_GATHER": 41,
        "VMM_ERROR_GATHER": 42,
        "FLUSH_AGREEMENT": 43,
        "GRAMMAR_AGREEMENT": 44,
    }
    assert phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE == 8
    assert phases.LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE == 7
    assert [p for p in phases.Phase if p.is_collective] == list(range(16, 45))

