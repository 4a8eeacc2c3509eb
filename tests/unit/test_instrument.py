"""The rank instrumentation verifies and installs on the real SGLang 0.5.23, refuses changed targets, and its
seams write the expected phase, loop and collective counts into a real ledger."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdfleet.runtime import engine_setup
from pdfleet.runtime.health import attach, ledger, records
from pdfleet.runtime.health.phases import LoopName, Phase
from pdfleet.runtime.instrument import apply, rank_seams, seams
from pdfleet.runtime.patches import base, catalogue, targets
from pdfleet.runtime.patches.impl import overlap_loop_report
from tests.support import requires
from tests.support.sglang_args import build_server_args

VERSION = "0.5.23"
ALL_TARGETS = (*rank_seams.FINGERPRINTS[VERSION], overlap_loop_report.TARGET)


@pytest.fixture(autouse=True)
def restored_sglang(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every test may patch the real SGLang modules: put the originals back afterwards, forget the rank's
    writer, and point the ledger at a temporary file."""
    requires.installed("sglang")
    for dotted in ALL_TARGETS:
        t = targets.resolve(dotted)
        monkeypatch.setattr(t.owner, t.attr, t.function)
    monkeypatch.setattr(seams, "_writer", seams.UNATTACHED)
    monkeypatch.setenv(ledger.PATH_ENV, str(tmp_path / "ledger"))


def read(path: Path, slot: int = 0) -> records.RankRecord:
    with ledger.Ledger.open_readonly(path) as led:
        record = led.read(slot)
    assert record is not None
    return record


def test_the_instrumentation_verifies_and_installs_on_the_real_sglang() -> None:
    applied = engine_setup.apply_selected([])
    assert [a.id for a in applied] == ["overlap-loop-report", apply.ID]
    for dotted in ALL_TARGETS:
        assert targets.resolve(dotted).function.__pdfleet_patch__ in ("overlap-loop-report", apply.ID)


def test_selecting_overlap_loop_report_explicitly_applies_it_once() -> None:
    applied = engine_setup.apply_selected(["overlap-loop-report"])
    assert [a.id for a in applied] == ["overlap-loop-report", apply.ID]


def test_every_wrapper_takes_exactly_the_parameters_of_its_target() -> None:
    for dotted, wrap in rank_seams.WRAPPERS.items():
        original = targets.resolve(dotted).function
        expected = [(p.name, p.kind, p.default) for p in inspect.signature(original).parameters.values()]
        actual = [(p.name, p.kind, p.default) for p in inspect.signature(wrap(original)).parameters.values()]
        assert actual == expected, dotted


def test_every_seam_has_a_fingerprint_and_a_wrapper() -> None:
    assert set(rank_seams.FINGERPRINTS[VERSION]) == set(rank_seams.WRAPPERS)


def test_a_target_replaced_by_a_different_function_is_refused_and_nothing_is_installed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    decode = importlib.import_module("sglang.srt.disaggregation.decode")

    def poll_and_all_reduce(pollers: Any, gloo_group: Any, decode_reqs: Any = None, metadata_buffers: Any = None):
        return []

    monkeypatch.setattr(decode, "poll_and_all_reduce", poll_and_all_reduce)
    with pytest.raises(base.PatchError, match=r"decode\.poll_and_all_reduce is not the function"):
        apply.install(VERSION)
    assert not hasattr(targets.resolve("sglang.srt.managers.scheduler.Scheduler.run_batch").function,
                       "__pdfleet_patch__")


def test_a_target_whose_source_changed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real_getsource = inspect.getsource
    on_idle = targets.resolve("sglang.srt.managers.scheduler.Scheduler.on_idle").function

    def getsource(obj: Any) -> str:
        text = real_getsource(obj)
        return text + "    self.abort_everything()\n" if obj is inspect.unwrap(on_idle) else text

    monkeypatch.setattr(targets.inspect, "getsource", getsource)
    with pytest.raises(base.PatchError, match=r"Scheduler\.on_idle is not the function"):
        apply.install(VERSION)


def test_an_unknown_sglang_version_is_refused() -> None:
    with pytest.raises(base.PatchError, match=r"was not checked against SGLang 0\.6\.1"):
        apply.install("0.6.1")


def test_admission_knows_exactly_the_releases_the_runtime_instruments() -> None:
    # An SGLang release outside this list is refused at admission (operator/api/checks.py), not at engine start.
    assert set(catalogue.INSTRUMENTED) == set(rank_seams.FINGERPRINTS)


def test_installing_twice_is_refused() -> None:
    apply.install(VERSION)
    with pytest.raises(base.PatchError, match="already instrumented"):
        apply.install(VERSION)


def test_a_catalogue_patch_of_a_seam_is_wrapped_not_undone() -> None:
    decode = importlib.import_module("sglang.srt.disaggregation.decode")
    original = decode.poll_and_all_reduce
    calls = []

    def lockstep(pollers: Any, gloo_group: Any, decode_reqs: Any = None, metadata_buffers: Any = None) -> Any:
        calls.append(pollers)
        return [0]

    decode.poll_and_all_reduce = base.mark(lockstep, "kv-poll-lockstep", original)
    apply.install(VERSION)
    assert decode.poll_and_all_reduce.__wrapped_original__ is lockstep
    assert decode.poll_and_all_reduce(["p"], None) == [0]
    assert calls == [["p"]]


def test_a_catalogue_patch_over_a_changed_sglang_function_is_refused() -> None:
    decode = importlib.import_module("sglang.srt.disaggregation.decode")

    def elsewhere(pollers: Any, gloo_group: Any, decode_reqs: Any = None, metadata_buffers: Any = None) -> Any:
        return []

    decode.poll_and_all_reduce = base.mark(lambda *a: [], "kv-poll-lockstep", elsewhere)
    with pytest.raises(base.PatchError, match="under patch kv-poll-lockstep"):
        apply.install(VERSION)


# --- the loop dispatcher --------------------------------------------------------------------------------

class FakeScheduler:
    """What `_dispatch_event_loop_once` reads, with stub loops that return at once. `enable_overlap` is
    derived as `Scheduler.__init__` derives it in 0.5.23 (no MLX here)."""

    def __init__(self, mode: Any, server_args: Any) -> None:
        self.disaggregation_mode = mode
        self.server_args = server_args
        self.enable_overlap = not server_args.disable_overlap_schedule
        self.enable_overlap_mlx = False
        self.enable_pdmux = False
        self.gracefully_exit = False
        self.ran: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("event_loop_"):
            return lambda: self.ran.append(name)
        raise AttributeError(name)


@pytest.fixture
def two_rank_pod() -> Iterator[None]:
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(tp_rank=1, tp_size=2, pp_rank=0, pp_size=1, nnodes=1, dp_size=1,
                                 enable_dp_attention=False, dp_rank=None):
        yield


@pytest.mark.parametrize(("mode", "overlap_flag", "loop"), [
    ("decode", [], LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE),
    ("decode", ["--disable-overlap-schedule"], LoopName.EVENT_LOOP_NORMAL_DISAGG_DECODE),
    ("prefill", [], LoopName.EVENT_LOOP_OVERLAP_DISAGG_PREFILL),
    ("prefill", ["--disable-overlap-schedule"], LoopName.EVENT_LOOP_NORMAL_DISAGG_PREFILL),
])
def test_the_patched_dispatcher_records_the_loop_sglang_picked(
        two_rank_pod: None, tmp_path: Path, mode: str, overlap_flag: list[str], loop: LoopName) -> None:
    from sglang.srt.disaggregation.utils import DisaggregationMode

    scheduler_module = importlib.import_module("sglang.srt.managers.scheduler")
    engine_setup.apply_selected([])
    args = build_server_args(["--model-path", "/m", "--tp-size", "2", "--disaggregation-mode", mode, *overlap_flag])
    scheduler = FakeScheduler(DisaggregationMode(mode), args)

    scheduler_module.dispatch_event_loop(scheduler)

    assert scheduler.ran == [loop.method]
    record = read(tmp_path / "ledger", slot=1)
    assert (record.loop, record.rank, record.phase) == (loop, 1, Phase.STARTING)


def test_a_dispatch_after_a_role_switch_records_the_new_loop_in_the_same_slot(
        two_rank_pod: None, tmp_path: Path) -> None:
    from sglang.srt.disaggregation.utils import DisaggregationMode

    scheduler_module = importlib.import_module("sglang.srt.managers.scheduler")
    engine_setup.apply_selected([])
    scheduler = FakeScheduler(DisaggregationMode.PREFILL, build_server_args(["--model-path", "/m"]))
    scheduler_module._dispatch_event_loop_once(scheduler)
    scheduler.disaggregation_mode = DisaggregationMode.DECODE
    scheduler_module._dispatch_event_loop_once(scheduler)

    assert scheduler.ran == ["event_loop_overlap_disagg_prefill", "event_loop_overlap_disagg_decode"]
    with ledger.Ledger.open_readonly(tmp_path / "ledger") as led:
        assert [r.loop for r in led.read_all()] == [LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE]


def test_a_loop_that_ends_in_shutdown_leaves_the_slot_exited(two_rank_pod: None, tmp_path: Path) -> None:
    from sglang.srt.disaggregation.utils import DisaggregationMode

    scheduler_module = importlib.import_module("sglang.srt.managers.scheduler")
    engine_setup.apply_selected([])
    scheduler = FakeScheduler(DisaggregationMode.DECODE, build_server_args(["--model-path", "/m"]))
    scheduler.gracefully_exit = True
    scheduler_module._dispatch_event_loop_once(scheduler)
    assert read(tmp_path / "ledger", slot=1).phase == Phase.EXITED
    assert seams.current() is seams.UNATTACHED


def test_a_loop_that_raises_leaves_the_slot_as_it_was_so_the_rank_reads_as_dead(
        two_rank_pod: None, tmp_path: Path) -> None:
    """SGLang's `run_scheduler_process` catches the exception and the process then exits normally: only the
    record can tell a crash from a shutdown, so a crash must not say EXITED."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    class Crashing(FakeScheduler):
        def event_loop_normal_disagg_decode(self) -> None:
            seams.current().collective(Phase.KV_POLL_ALL_REDUCE)
            raise RuntimeError("NCCL error")

    scheduler_module = importlib.import_module("sglang.srt.managers.scheduler")
    engine_setup.apply_selected([])
    scheduler = Crashing(DisaggregationMode.DECODE, build_server_args(["--model-path", "/m",
                                                                       "--disable-overlap-schedule"]))
    try:
        with pytest.raises(RuntimeError, match="NCCL error"):
            scheduler_module._dispatch_event_loop_once(scheduler)
        assert read(tmp_path / "ledger", slot=1).phase == Phase.KV_POLL_ALL_REDUCE
    finally:
        seams.use(seams.UNATTACHED)


# --- the hot-path seams, with a real writer -------------------------------------------------------------

@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Any]:
    w = attach.attach_rank(slot=0, rank=0, slots=1, path=tmp_path / "ledger", stack_signal=None)
    seams.use(w)
    yield w
    seams.use(seams.UNATTACHED)


def test_a_collective_seam_is_counted_while_it_waits_and_left_for_local_work(writer: Any, tmp_path: Path) -> None:
    seen = []

    def broadcast(data: Any, rank: int, dist_group: Any = None, src: int = 0, force_cpu_device: bool = True) -> Any:
        seen.append(read(tmp_path / "ledger"))
        return data

    wrapped = seams.broadcast_pyobj(broadcast)
    assert wrapped([1], 0, None, src=0) == [1]
    assert wrapped([2], 0) == [2]
    assert [(r.phase, r.collectives) for r in seen] == [(Phase.RECV_BROADCAST, 1), (Phase.RECV_BROADCAST, 2)]
    after = read(tmp_path / "ledger")
    assert (after.phase, after.collectives) == (Phase.LOCAL, 2)


@pytest.mark.parametrize(("wrap", "args", "phase"), [
    (seams.poll_and_all_reduce, ([], None), Phase.KV_POLL_ALL_REDUCE),
    (seams.poll_and_all_reduce_with_staging, ([], None, None), Phase.KV_POLL_ALL_REDUCE),
    (seams.poll_and_all_reduce_attn_cp_tp_group, ([], None, None), Phase.KV_POLL_ALL_REDUCE),
    (seams.poll_and_all_reduce_prefill_pp, ([], None, None, None, 0, 1, []), Phase.KV_POLL_ALL_REDUCE),
    (seams.attn_cp_tp_broadcast_pyobj, ([],), Phase.RECV_BROADCAST),
    (seams.mlp_sync_all_gather, (object(), "cpu", None), Phase.MLP_SYNC_ALL_GATHER),
])
def test_each_collective_seam_records_its_own_phase(writer: Any, tmp_path: Path, wrap: Any, args: tuple[Any, ...],
                                                    phase: Phase) -> None:
    seen = []
    wrap(lambda *a: seen.append(read(tmp_path / "ledger")))(*args)
    assert (seen[0].phase, seen[0].collectives) == (phase, 1)
    assert read(tmp_path / "ledger").phase == Phase.LOCAL


def test_every_audited_caller_resolves_in_the_installed_sglang_to_its_own_phase() -> None:
    sites = rank_seams.sites_by_code()
    assert len(sites) == len(rank_seams.SITES)
    assert set(sites.values()) == set(rank_seams.SITES.values())
    assert Phase.KV_POLL_ALL_REDUCE not in sites.values()


def test_a_poll_seam_records_the_phase_of_the_audited_caller_that_entered_it(writer: Any, tmp_path: Path) -> None:
    seen: list[Phase] = []

    def original(*_: Any) -> None:
        seen.append(read(tmp_path / "ledger").phase)

    def audited() -> None:
        poll([], None)

    def elsewhere() -> None:
        poll([], None)

    poll = seams.poll_and_all_reduce(original, {audited.__code__: Phase.PREALLOC_HANDSHAKE_POLL})
    audited()
    elsewhere()
    assert seen == [Phase.PREALLOC_HANDSHAKE_POLL, Phase.KV_POLL_ALL_REDUCE]
    assert read(tmp_path / "ledger").collectives == 2


def test_a_flag_reduction_is_marked_only_when_it_reduces_and_under_its_caller_s_phase(
        writer: Any, tmp_path: Path) -> None:
    seen: list[Phase] = []

    def original(flags: Any, group: Any, op: Any) -> Any:
        seen.append(read(tmp_path / "ledger").phase)
        return flags

    def pop_transferred(flags: list[int]) -> Any:
        return reduce(flags=flags, group=None, op="max")

    reduce = seams.all_reduce_flags(original, {pop_transferred.__code__: Phase.FAILED_TRANSFER_FLAGS})
    assert pop_transferred([]) == []  # SGLang enters no collective on an empty list: nothing is counted
    assert read(tmp_path / "ledger").collectives == 0
    assert pop_transferred([1]) == [1]
    assert reduce([0], None, "min") == [0]  # any other caller
    assert seen == [Phase.STARTING, Phase.FAILED_TRANSFER_FLAGS, Phase.OTHER_COLLECTIVE]
    after = read(tmp_path / "ledger")
    assert (after.phase, after.collectives) == (Phase.LOCAL, 2)


def test_a_caller_under_a_catalogue_patch_is_known_by_sglang_s_own_code() -> None:
    # A patch that defers to SGLang's original (the PP path of kv-poll-lockstep) enters the poll from the
    # original's frame, so that is the code the site table must hold.
    def sglang_caller() -> None:
        pass

    patched = base.mark(lambda: sglang_caller(), "kv-poll-lockstep", sglang_caller)
    assert rank_seams.sglang_code(patched) is sglang_caller.__code__


def test_forward_and_idle_are_phases_not_collectives(writer: Any, tmp_path: Path) -> None:
    seen = []
    seams.run_batch(lambda *a: seen.append(read(tmp_path / "ledger")))(object(), "batch")
    seams.on_idle(lambda *a: seen.append(read(tmp_path / "ledger")))(object())
    assert [(r.phase, r.collectives) for r in seen] == [(Phase.FORWARD, 0), (Phase.IDLE, 0)]


def test_input_intake_counts_one_iteration_per_call(writer: Any, tmp_path: Path) -> None:
    ingest = seams.ingest_requests(lambda self, stop_at_pause: [])
    for _ in range(3):
        ingest(object())
    assert read(tmp_path / "ledger").iteration == 3


def test_the_real_kv_poll_seam_writes_the_ledger_around_a_real_gloo_all_reduce(writer: Any, tmp_path: Path) -> None:
    torch = requires.module("torch")
    dist = torch.distributed
    decode = importlib.import_module("sglang.srt.disaggregation.decode")
    apply.install(VERSION)

    class Poller:
        def poll(self) -> int:
            return 2

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        polls = decode.poll_and_all_reduce([Poller(), Poller()], dist.group.WORLD)
    finally:
        dist.destroy_process_group()
    assert polls == [2, 2]
    record = read(tmp_path / "ledger")
    assert (record.phase, record.collectives) == (Phase.LOCAL, 1)


def test_seams_in_a_process_without_a_slot_do_nothing() -> None:
    assert seams.current() is seams.UNATTACHED
    assert seams.broadcast_pyobj(lambda *a: a[0])([7], 0) == [7]
