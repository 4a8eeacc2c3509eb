"""The two desync fix patches: they verify and install on the installed SGLang 0.5.23, a changed target is
refused, and their decisions hold as tables. (tests/unit/test_desync_reproduction.py shows them preventing
the real hang.)"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from pdfleet.runtime.patches import base, catalogue, registry, targets
from pdfleet.runtime.patches.impl import abort_consensus, kv_poll_lockstep
from pdfleet.runtime.patches.impl.abort_consensus import Route
from pdfleet.runtime.patches.impl.kv_poll_lockstep import ROUND, Agreement, agree
from pdfleet.runtime.patches.impl.prealloc_lockstep import handshake_states

VERSION = "0.5.23"
IDS = (kv_poll_lockstep.PATCH_ID, abort_consensus.PATCH_ID)
IMPLS = {kv_poll_lockstep.PATCH_ID: kv_poll_lockstep, abort_consensus.PATCH_ID: abort_consensus}


@pytest.fixture
def restore_sglang() -> Iterator[None]:
    """Puts every target back as it was, so that patching here leaks into no other test."""
    saved = []
    for impl in IMPLS.values():
        for dotted in impl.TARGETS:
            t = targets.resolve(dotted)
            saved.append((t.owner, t.attr, inspect.getattr_static(t.owner, t.attr)))
    yield
    for owner, attr, original in saved:
        setattr(owner, attr, original)


# --- the patches against the installed SGLang ---------------------------------------------------------------

@pytest.mark.parametrize("patch_id", IDS)
def test_each_patch_names_the_same_targets_in_the_catalogue_and_its_fingerprints(patch_id: str) -> None:
    impl = IMPLS[patch_id]
    assert catalogue.BY_ID[patch_id].targets == impl.TARGETS
    assert set(impl.FINGERPRINTS[VERSION]) == set(impl.TARGETS)
    assert registry.MODULES[patch_id] == impl.__name__


@pytest.mark.parametrize("patch_id", IDS)
def test_every_target_matches_its_fingerprint_in_the_installed_sglang(patch_id: str) -> None:
    impl = IMPLS[patch_id]
    for dotted, expected in impl.FINGERPRINTS[VERSION].items():
        assert targets.verify(dotted, expected).function is not None


def test_both_patches_install_on_sglang_and_a_second_application_is_refused(restore_sglang: None) -> None:
    applied = base.apply(IDS, VERSION, registry.implementations(IDS))
    assert [a.id for a in applied] == list(IDS)
    for impl in IMPLS.values():
        kept = getattr(impl, "FINGERPRINTED_ONLY", ())
        for dotted in impl.TARGETS:
            installed = targets.resolve(dotted).function
            if dotted in kept:  # verified, not replaced
                assert not hasattr(installed, "__pdfleet_patch__"), dotted
                continue
            assert installed.__pdfleet_patch__ == impl.PATCH_ID
            assert installed.__wrapped_original__ is not None
    with pytest.raises(base.PatchError, match="already patched by kv-poll-lockstep"):
        base.apply(IDS, VERSION, registry.implementations(IDS))


def test_a_changed_target_is_refused_and_nothing_is_installed(restore_sglang: None) -> None:
    from sglang.srt.disaggregation.decode import DecodeTransferQueue
    from sglang.srt.managers.scheduler import Scheduler

    def pop_transferred(self: Any, rids_to_check: Any = None) -> list[Any]:
        return []  # some other SGLang's version of the function

    DecodeTransferQueue.pop_transferred = pop_transferred  # type: ignore[method-assign]
    untouched = inspect.getattr_static(Scheduler, "abort_request")
    with pytest.raises(base.PatchError, match=r"DecodeTransferQueue\.pop_transferred is not the function"):
        base.apply(IDS, VERSION, registry.implementations(IDS))
    assert DecodeTransferQueue.pop_transferred is pop_transferred
    assert inspect.getattr_static(Scheduler, "abort_request") is untouched, "all or nothing"


def test_a_version_without_fingerprints_is_refused() -> None:
    with pytest.raises(base.PatchError, match="applies to SGLang"):
        base.apply(IDS, "0.4.0", registry.implementations(IDS))


# --- kv-poll-lockstep: the agreement every rank computes ---------------------------------------------------

F, B, W, T, S = 0, 1, 2, 3, 4  # KVPoll: Failed, Bootstrapping, WaitingForInput, Transferring, Success


@pytest.mark.parametrize(
    ("per_rank", "expected"),
    [
        ([], Agreement((), {})),
        ([[], [], [], []], Agreement((), {})),
        ([[(1, S)], [(1, S)]], Agreement((1,), {1: S})),
        ([[(1, S)], [(1, T)]], Agreement((1,), {1: T})),  # Success only when every rank succeeded
        ([[(1, T)], [(1, F)], [(1, S)]], Agreement((1,), {1: F})),  # one failure is everyone's
        ([[(1, T), (2, T)], [(1, T), (2, T)], [(2, T)], [(1, T), (2, T)]], Agreement((2,), {2: T})),  # rank 2 dropped 1
        ([[(1, T)], [(1, T)], [], [(1, T)]], Agreement((), {})),  # the reproduction: rank 2's queue is empty
        ([[(2, T), (1, S)], [(1, S), (2, T)]], Agreement((2, 1), {2: T, 1: S})),  # rank 0's order wins
        ([[(1, S)], [(1, S), (3, T)]], Agreement((1,), {1: S})),  # a key rank 0 lacks is dropped too
    ],
)
def test_ranks_agree_on_the_requests_all_of_them_hold_with_the_smallest_state(
    per_rank: list[list[tuple[int, int]]], expected: Agreement
) -> None:
    assert agree(per_rank) == expected


@pytest.mark.parametrize(("totals", "rounds"), [([], 1), ([0, 0], 1), ([1, 0], 1), ([ROUND, 3], 1),
                                                  ([ROUND + 1, 0], 2), ([0, 3 * ROUND], 3)])
def test_every_rank_exchanges_as_many_rows_as_the_largest_queue_needs_and_at_least_one(
    totals: list[int], rounds: int
) -> None:
    assert kv_poll_lockstep.rounds_needed(totals) == rounds


@pytest.mark.parametrize("count", [0, 1, ROUND - 1, ROUND, ROUND + 1, 2 * ROUND + 5])
def test_rows_have_a_fixed_width_and_carry_every_entry(count: int) -> None:
    entries = [(kv_poll_lockstep.request_key(f"r{i}"), i % 5) for i in range(count)]
    back: list[tuple[int, int]] = []
    for index in range(kv_poll_lockstep.rounds_needed([count])):
        row = kv_poll_lockstep.pack_row(entries, index)
        assert len(row) == kv_poll_lockstep.ROW_WIDTH
        total, pairs = kv_poll_lockstep.unpack_row(row)
        assert total == count
        back.extend(pairs)
    assert back == entries


def test_request_keys_are_stable_non_negative_and_fit_in_an_int64() -> None:
    key = kv_poll_lockstep.request_key("req-x")
    assert key == kv_poll_lockstep.request_key("req-x") != kv_poll_lockstep.request_key("req-y")
    assert 0 <= key < 2**63


def _queue(rids: list[str]) -> SimpleNamespace:
    dropped: list[str] = []
    freed: list[int] = []
    queue = SimpleNamespace(
        queue=[SimpleNamespace(req=SimpleNamespace(rid=r, bootstrap_room=i, return_logprob=False),
                               kv_receiver=SimpleNamespace(abort=lambda: None, clear=lambda: None),
                               metadata_buffer_index=i) for i, r in enumerate(rids)],
        tp_rank=1, enable_staging=False, enable_deferred_kv_release=False, _is_host_destination=lambda d: False,
        scheduler=SimpleNamespace(output_streamer=SimpleNamespace(stream_output=lambda reqs, _: None)),
        _clean_hicache_prefetch_resources=lambda d: None, _release_request=lambda d: dropped.append(d.req.rid),
        metadata_buffers=SimpleNamespace(clear_slot=lambda i: None),
        req_to_metadata_buffer_idx_allocator=SimpleNamespace(free=freed.append),
        _record_transfer_failure=lambda reason: None,
    )
    queue.dropped, queue.freed = dropped, freed
    return queue


_SG = kv_poll_lockstep._SGLang(poll=list, metadata_gate=lambda *a: None, status=500,
                               prepare_abort=lambda req, msg, status_code: setattr(req, "finished_reason", msg))


def test_a_transfer_some_rank_no_longer_holds_is_aborted_and_released_here() -> None:
    queue = _queue(["a", "b", "c"])
    keys = [kv_poll_lockstep.request_key(r) for r in ("a", "b", "c")]
    kb, kc = keys[1], keys[2]
    kv_poll_lockstep._reconcile(queue, keys, Agreement(order=(kc, kb), states={kb: T, kc: T}), _SG)
    assert [d.req.rid for d in queue.queue] == ["c", "b"], "the lead rank's order"
    assert queue.dropped == ["a"]
    assert queue.freed == [0]


def test_the_poll_step_returns_the_agreed_states_instead_of_reducing_again() -> None:
    calls: list[str] = []
    originals = {kv_poll_lockstep.POP_TRANSFERRED: lambda self, r=None: calls.append("pop"),
                 kv_poll_lockstep.POLL_WITH_METADATA_GATE: lambda self: calls.append("reduce") or [F, F],
                 kv_poll_lockstep.PROCESS_DECODE_QUEUE: lambda self: None,
                 kv_poll_lockstep.UPDATE_HANDSHAKE_WAITERS: lambda self, *a: None,
                 kv_poll_lockstep.POP_BOOTSTRAPPED: lambda self: [],
                 kv_poll_lockstep.PROCESS_INFLIGHT: lambda self, *a: [],
                 kv_poll_lockstep.RESOLVE_WAITING_BOOTSTRAP: lambda self: None,
                 kv_poll_lockstep.PROCESS_PREFILL_CHUNK: lambda self, **kw: None,
                 kv_poll_lockstep.RELEASE_MEMORY_OCCUPATION: lambda self: None}
    replaced = kv_poll_lockstep.replacements(originals)[kv_poll_lockstep.POLL_WITH_METADATA_GATE]
    queue = _queue(["a", "b"])
    setattr(queue, kv_poll_lockstep._AGREED, {kv_poll_lockstep.request_key("a"): S,
                                               kv_poll_lockstep.request_key("b"): T})
    assert replaced(queue) == [S, T]
    setattr(queue, kv_poll_lockstep._AGREED, None)
    assert replaced(queue) == [F, F] and calls == ["reduce"], "outside pop_transferred it is SGLang's own"


# --- abort-consensus: who acts on an abort -----------------------------------------------------------------

@pytest.mark.parametrize(
    ("from_broadcast", "decider", "route"),
    [(True, True, Route.APPLY), (True, False, Route.APPLY), (False, True, Route.DEFER), (False, False, Route.IGNORE)],
)
def test_an_abort_is_applied_only_from_the_broadcast_and_decided_only_by_the_lead_rank(
    from_broadcast: bool, decider: bool, route: Route
) -> None:
    assert abort_consensus.route(from_broadcast=from_broadcast, decider=decider) is route


@pytest.mark.parametrize(
    ("pp", "tp", "cp", "decides"),
    [(0, 0, 0, True), (0, 1, 0, False), (1, 0, 0, False), (0, 0, 1, False)],
)
def test_the_deciding_rank_is_the_one_whose_requests_its_peers_receive(
    pp: int, tp: int, cp: int, decides: bool
) -> None:
    parallel = SimpleNamespace(pp_rank=pp, attn_tp_rank=tp, attn_cp_rank=cp)
    assert abort_consensus.is_decider(parallel) is decides


@pytest.mark.parametrize("tp_rank", [0, 2])
def test_a_local_abort_rides_the_lead_ranks_next_broadcast_and_is_applied_there_on_every_rank(
    monkeypatch: pytest.MonkeyPatch, tp_rank: int
) -> None:
    from sglang.srt import runtime_context

    monkeypatch.setattr(runtime_context, "get_parallel",
                        lambda: SimpleNamespace(pp_rank=0, attn_tp_rank=tp_rank, attn_cp_rank=0))
    applied: list[str] = []
    originals = {
        abort_consensus.ABORT_REQUEST: lambda self, req: applied.append(req),
        abort_consensus.PROCESS_INPUT_REQUESTS: lambda self, reqs: [self.abort_request(r) for r in reqs],
        abort_consensus.POLL_TIMEOUT_ABORTS: lambda self: ["timeout"],
        abort_consensus.MAYBE_REAP: lambda self, now, interval=1.0: None,  # sessions: test_session_reap_consensus
    }
    new = abort_consensus.replacements(originals)
    scheduler = SimpleNamespace()
    scheduler.abort_request = lambda req: new[abort_consensus.ABORT_REQUEST](scheduler, req)

    scheduler.abort_request("local")  # a rank-local decision
    assert applied == []
    broadcast = new[abort_consensus.POLL_TIMEOUT_ABORTS](scheduler)  # what this rank adds to its broadcast
    assert broadcast == (["timeout", "local"] if tp_rank == 0 else ["timeout"])
    assert new[abort_consensus.POLL_TIMEOUT_ABORTS](scheduler) == ["timeout"], "sent once"
    new[abort_consensus.PROCESS_INPUT_REQUESTS](scheduler, ["local"])  # every rank receives rank 0's broadcast
    assert applied == ["local"]


# --- kv-poll-lockstep: the prealloc handshake's agreement -------------------------------------------------


def test_a_handshake_held_by_every_rank_gets_the_smallest_state_and_one_missing_anywhere_fails() -> None:
    failed, bootstrapping, waiting = 0, 1, 2
    per_rank = [[(1, waiting), (2, waiting)], [(1, bootstrapping)], [(2, waiting), (1, waiting)]]
    assert handshake_states(per_rank, failed=failed) == {1: bootstrapping, 2: failed}
    assert handshake_states([[], []], failed=failed) == {}
    assert handshake_states([], failed=failed) == {}


def test_kv_poll_lockstep_declares_every_target_it_replaces_with_a_fingerprint() -> None:
    entry = catalogue.BY_ID[kv_poll_lockstep.PATCH_ID]
    assert set(entry.targets) == set(kv_poll_lockstep.TARGETS)
    assert set(kv_poll_lockstep.FINGERPRINTS["0.5.23"]) == set(kv_poll_lockstep.TARGETS)
