"""A transfer kv-poll-lockstep drops keeps its KV pages until the prefill side lets go, as SGLang's own failed
transfers do: SGLang 0.5.23's real `DecodeTransferQueue` release path, `CommonKVReceiver.abort` and
`CommonKVManager`'s abort-ack tracker, built without their GPU- and socket-bound constructors. The prefill side
is the tracker: an ack is what `CommonKVManager.handle_abort_ack_message` records for one prefill rank."""

from __future__ import annotations

import collections
import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from pdfleet.runtime.patches.impl import dropped_holds
from pdfleet.runtime.patches.impl import kv_poll_lockstep as lockstep
from tests.support import requires

pytestmark = pytest.mark.usefixtures("sglang_installed")

PREFILL_RANKS = 2
TIMEOUT_S = 30.0


@pytest.fixture
def sglang_installed() -> None:
    requires.installed("sglang")


class Released:
    """What the queue gave back: KV pages per request id, metadata slots."""

    def __init__(self) -> None:
        self.pages: list[str] = []
        self.slots: list[int] = []


def _manager(deferred: bool) -> Any:
    from sglang.srt.disaggregation.common.conn import CommonKVManager

    mgr = object.__new__(CommonKVManager)
    vars(mgr).update(
        enable_deferred_decode_kv_release=deferred, _deferred_abort_ack_tracker={}, _deferred_abort_generation=0,
        request_status={}, deferred_bootstrap=None, failure_lock=threading.Lock(), failure_records={},
        local_ip="127.0.0.1", rank_port=0, defer_decode_allocation=False, required_prefill_response_num_table={},
        prefill_response_tracker={}, addr_to_rooms_tracker=collections.defaultdict(set),
    )
    return mgr


def _receiver(mgr: Any, room: int) -> Any:
    """A decode receiver whose metadata went out to `PREFILL_RANKS` prefill ranks (they may be writing)."""
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.common.conn import CommonKVReceiver

    def unreachable(_: Any) -> Any:
        raise OSError("no prefill here")  # the notification is best effort in SGLang; the ack is the test's

    receiver = object.__new__(CommonKVReceiver)
    vars(receiver).update(
        kv_mgr=mgr, bootstrap_room=room, bootstrap_addr="127.0.0.1:8998", conclude_state=None,
        abort_notified=False, init_time=1.0, bootstrap_infos=[{"rank_ip": "127.0.0.1"}] * PREFILL_RANKS,
        _connect_to_bootstrap_server=unreachable,
    )
    mgr.request_status[room] = KVPoll.Transferring
    return receiver


def _queue(released: Released, deferred: bool, host: bool = False) -> Any:
    from sglang.srt.disaggregation.decode import DecodeTransferQueue
    from sglang.srt.disaggregation.utils import ReqToMetadataIdxAllocator

    queue = object.__new__(DecodeTransferQueue)
    vars(queue).update(
        queue=[], tp_rank=1, enable_staging=False, staging_handler=None, enable_host_receive=host,
        enable_deferred_kv_release=deferred, deferred_kv_release_timeout=TIMEOUT_S, _deferred_releases=[],
        req_to_metadata_buffer_idx_allocator=ReqToMetadataIdxAllocator(8),
        metadata_buffers=SimpleNamespace(clear_slot=released.slots.append),
        tree_cache=SimpleNamespace(unlock=lambda _: None),
        scheduler=SimpleNamespace(output_streamer=SimpleNamespace(stream_output=lambda *_: None),
                                  metrics_reporter=SimpleNamespace(enable_metrics=False)),
        # No KV pool on a CPU: the release is recorded instead (SGLang's release_kv_cache frees the pages).
        _release_request=lambda d: released.pages.append(d.req.rid),
    )
    return queue


def _transfer(queue: Any, receiver: Any, rid: str, host_staged: bool = False) -> Any:
    from sglang.srt.disaggregation.decode import DecodeRequest

    req = SimpleNamespace(rid=rid, bootstrap_room=receiver.bootstrap_room, finished_reason=None, to_finish=None,
                          return_logprob=False, cache_request_handle=None)
    decode_req = DecodeRequest(req=req, kv_receiver=receiver,
                               metadata_buffer_index=queue.req_to_metadata_buffer_idx_allocator.alloc())
    decode_req.host_staged = host_staged
    queue.queue.append(decode_req)
    return decode_req


def _drop(queue: Any, decode_req: Any) -> None:
    lockstep._drop_divergent(queue, decode_req, lockstep._bind_sglang())


def _ack_all(mgr: Any, room: int) -> None:
    generation = mgr._deferred_abort_ack_tracker[room].generation
    for prefill_rank in range(PREFILL_RANKS):
        mgr.note_abort_ack(room, prefill_rank, generation)


def test_a_dropped_transfer_keeps_its_pages_until_every_prefill_rank_acks_the_abort() -> None:
    released, mgr = Released(), _manager(deferred=True)
    queue = _queue(released, deferred=True)
    decode_req = _transfer(queue, _receiver(mgr, room=7), "r1")
    slot = decode_req.metadata_buffer_index

    _drop(queue, decode_req)

    assert released.pages == [] and released.slots == []
    assert decode_req.req.finished_reason is not None  # the client is told, as on SGLang's failure path
    assert 7 in mgr._deferred_abort_ack_tracker  # armed: the abort went out, acks are counted
    assert queue._deferred_releases == []  # SGLang's own list stays equal on every rank
    [entry] = dropped_holds.holds(queue)
    assert dropped_holds.release_due(queue, now=entry.since + 1) == 0

    generation = mgr._deferred_abort_ack_tracker[7].generation
    mgr.note_abort_ack(7, 0, generation)
    assert dropped_holds.release_due(queue, now=entry.since + 2) == 0  # one prefill rank may still write
    mgr.note_abort_ack(7, 1, generation)
    assert dropped_holds.release_due(queue, now=entry.since + 3) == 1

    assert released.pages == ["r1"] and released.slots == [slot]
    assert 7 not in mgr._deferred_abort_ack_tracker and decode_req.kv_receiver is None
    assert dropped_holds.holds(queue) == []
    assert queue.req_to_metadata_buffer_idx_allocator.available_size() == 8


def test_pages_whose_prefill_never_acks_are_released_at_the_deadline_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    released, mgr = Released(), _manager(deferred=True)
    queue = _queue(released, deferred=True)
    _drop(queue, _transfer(queue, _receiver(mgr, room=8), "r2"))
    [entry] = dropped_holds.holds(queue)

    assert dropped_holds.release_due(queue, now=entry.since + TIMEOUT_S - 0.5) == 0
    with caplog.at_level(logging.WARNING, logger=dropped_holds.__name__):
        assert dropped_holds.release_due(queue, now=entry.since + TIMEOUT_S) == 1
    assert released.pages == ["r2"]
    assert "without a full drain ack" in caplog.text


def test_each_hold_is_released_on_its_own_acks() -> None:
    released, mgr = Released(), _manager(deferred=True)
    queue = _queue(released, deferred=True)
    _drop(queue, _transfer(queue, _receiver(mgr, room=11), "a"))
    _drop(queue, _transfer(queue, _receiver(mgr, room=12), "b"))

    _ack_all(mgr, 12)
    assert dropped_holds.release_due(queue) == 1
    assert released.pages == ["b"]
    assert [h.decode_req.req.rid for h in dropped_holds.holds(queue)] == ["a"]


def test_without_deferred_release_a_dropped_transfer_is_released_at_once() -> None:
    released, mgr = Released(), _manager(deferred=False)
    queue = _queue(released, deferred=False)
    decode_req = _transfer(queue, _receiver(mgr, room=9), "r3")
    slot = decode_req.metadata_buffer_index

    _drop(queue, decode_req)

    assert released.pages == ["r3"] and released.slots == [slot]
    assert dropped_holds.holds(queue) == [] and mgr._deferred_abort_ack_tracker == {}


def test_host_destination_pages_wait_for_the_host_drain_past_any_deadline() -> None:
    released, mgr = Released(), _manager(deferred=True)
    queue = _queue(released, deferred=True, host=True)
    receiver = _receiver(mgr, room=10)
    drained = {"safe": False}
    receiver.is_abort_release_safe = lambda: drained["safe"]
    _drop(queue, _transfer(queue, receiver, "r4", host_staged=True))
    [entry] = dropped_holds.holds(queue)
    assert entry.deadline is None

    assert dropped_holds.release_due(queue, now=entry.since + 10 * TIMEOUT_S) == 0
    drained["safe"] = True
    assert dropped_holds.release_due(queue, now=entry.since + 10 * TIMEOUT_S) == 1
    assert released.pages == ["r4"]


def test_the_patched_transfer_poll_releases_acknowledged_holds_on_its_next_call() -> None:
    """The wiring: kv-poll-lockstep's `pop_transferred` (on a one-rank gloo group) frees a hold whose prefill
    ranks acked, before its exchange, and keeps one that has not."""
    from pdfleet.runtime.patches import targets

    dist = requires.module("torch.distributed")
    released, mgr = Released(), _manager(deferred=True)
    queue = _queue(released, deferred=True)
    queue.scheduler.enable_decode_hicache = False
    _drop(queue, _transfer(queue, _receiver(mgr, room=21), "acked"))
    _drop(queue, _transfer(queue, _receiver(mgr, room=22), "waiting"))
    queue.queue = []  # both left the queue, as `_reconcile` leaves it
    _ack_all(mgr, 21)
    originals = {dotted: targets.resolve(dotted).function for dotted in lockstep.TARGETS}
    pop_transferred = lockstep.replacements(originals)[lockstep.POP_TRANSFERRED]

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        queue.gloo_group = dist.group.WORLD
        assert pop_transferred(queue) == []
    finally:
        dist.destroy_process_group()
    assert released.pages == ["acked"]
    assert [h.decode_req.req.rid for h in dropped_holds.holds(queue)] == ["waiting"]


def test_tearing_the_kv_pool_down_forgets_held_pages_instead_of_releasing_them_later() -> None:
    """SGLang's `release_memory_occupation` drops its own held entries without a release (the pool is gone);
    the patched one drops the lockstep's holds the same way, so no later poll frees pages of a dead pool."""
    from pdfleet.runtime.patches import targets

    released, mgr = Released(), _manager(deferred=True)
    queue = _queue(released, deferred=True)
    _drop(queue, _transfer(queue, _receiver(mgr, room=31), "held"))
    queue.queue = []
    originals = {dotted: targets.resolve(dotted).function for dotted in lockstep.TARGETS}
    release = lockstep.replacements(originals)[lockstep.RELEASE_MEMORY_OCCUPATION]

    release(queue)

    assert dropped_holds.holds(queue) == [] and released.pages == []
    _ack_all(mgr, 31)
    assert dropped_holds.release_due(queue) == 0
