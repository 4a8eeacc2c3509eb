"""kv-poll-lockstep on the prefill side (`prefill_lockstep`): the pure agreement over the attention-TP then
attention-CP exchanges, the stand-in poll that hands the agreed states to SGLang's own body, and the waiting
queue's and chunked request's replacements (which requests they poll; that every rank enters the exchange)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches.impl import kv_poll_lockstep as lockstep
from pdfleet.runtime.patches.impl import prefill_lockstep

FAILED, BOOTSTRAPPING, WAITING = 0, 1, 2


def _peers(*others: list[tuple[int, int]]) -> Any:
    """An exchange in which this rank's peers sent `others` (this rank's own entries come first)."""
    return lambda entries: [list(entries), *others]


def test_a_request_every_rank_holds_gets_the_smallest_state_and_one_a_peer_lacks_fails() -> None:
    local = [(1, WAITING), (2, WAITING), (3, BOOTSTRAPPING)]
    tp = _peers([(1, BOOTSTRAPPING), (3, WAITING)])  # the TP peer lost request 2
    assert prefill_lockstep.agreed_states(local, [tp], FAILED) == {1: BOOTSTRAPPING, 2: FAILED, 3: BOOTSTRAPPING}


def test_the_cp_exchange_reduces_what_the_tp_exchange_agreed() -> None:
    sent_to_cp: list[list[tuple[int, int]]] = []

    def cp(entries: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        sent_to_cp.append(list(entries))
        return [list(entries), [(1, WAITING), (2, WAITING)]]

    local = [(1, WAITING), (2, WAITING)]
    tp = _peers([(1, BOOTSTRAPPING), (2, WAITING)])
    assert prefill_lockstep.agreed_states(local, [tp, cp], FAILED) == {1: BOOTSTRAPPING, 2: WAITING}
    assert sent_to_cp == [[(1, BOOTSTRAPPING), (2, WAITING)]], "the CP group reduces the TP group's agreement"


def test_an_empty_queue_still_runs_every_exchange() -> None:
    calls: list[str] = []

    def exchange(name: str) -> Any:
        return lambda entries: calls.append(name) or [list(entries), [(7, WAITING)]]

    assert prefill_lockstep.agreed_states([], [exchange("tp"), exchange("cp")], FAILED) == {}
    assert calls == ["tp", "cp"]


def test_the_stand_in_poll_answers_the_agreed_states_only_for_its_own_senders() -> None:
    real_calls: list[int] = []
    module = SimpleNamespace(poll_and_all_reduce_attn_cp_tp_group=lambda p, cp, tp: real_calls.append(len(p)) or [9])
    real = module.poll_and_all_reduce_attn_cp_tp_group
    a, b = object(), object()
    with prefill_lockstep._answering(module, [a, b], [WAITING, FAILED]):
        assert module.poll_and_all_reduce_attn_cp_tp_group([a, b], None, None) == [WAITING, FAILED]
        assert module.poll_and_all_reduce_attn_cp_tp_group([b], None, None) == [9], "another list: the real poll"
    assert module.poll_and_all_reduce_attn_cp_tp_group is real
    assert real_calls == [1]


# --- The waiting queue's and the chunked request's polls ----------------------------------------------------
class _Sender:
    def __init__(self, state: int) -> None:
        self.state = state

    def poll(self) -> int:
        return self.state


def test_the_waiting_queue_polls_exactly_the_requests_not_aborted_in_queue_order() -> None:
    a, b, c = (SimpleNamespace(rid=rid) for rid in "abc")
    assert prefill_lockstep.waiting_candidates([a, b, c], lambda req: req is b) == [a, c]
    assert prefill_lockstep.waiting_candidates([b], lambda req: req is b) == []


def test_the_chunked_request_is_polled_only_while_its_bootstrap_is_pending() -> None:
    pending, done = SimpleNamespace(pending_bootstrap=True), SimpleNamespace(pending_bootstrap=False)
    assert prefill_lockstep.pending_chunk(pending) == [pending]
    assert prefill_lockstep.pending_chunk(done) == []
    assert prefill_lockstep.pending_chunk(None) == []


class _Ledger:
    """The seams' writer, noting the collectives entered."""

    def __init__(self) -> None:
        self.entered: list[phases.Phase] = []

    def collective(self, phase: phases.Phase) -> None:
        self.entered.append(phase)

    def begin(self, phase: phases.Phase) -> None: ...
    def step(self) -> None: ...
    def set_loop(self, loop: phases.LoopName) -> None: ...
    def close(self) -> None: ...


@pytest.fixture
def peers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[list[tuple[int, int]]], _Ledger]]:
    """The exchange as a group in which each peer sent the entries in the returned list (empty: every peer
    holds nothing), and the ledger the patched functions write to. Not PP."""
    from sglang.srt.disaggregation import prefill

    others: list[list[tuple[int, int]]] = []
    monkeypatch.setattr(lockstep, "exchange", lambda entries, group: [list(entries), *others])
    monkeypatch.setattr(prefill, "get_parallel", lambda: SimpleNamespace(pp_size=1))
    ledger = _Ledger()
    seams.use(ledger)
    try:
        yield others, ledger
    finally:
        seams.use(seams.UNATTACHED)


def _patched(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    originals: dict[str, Callable[..., Any]] = {target: _unused for target in lockstep.TARGETS}
    return prefill_lockstep.replacements({**originals, name: original})[name]


def _unused(*_: Any, **__: Any) -> None:
    raise AssertionError("not this target")


def _body_polls(seen: list[list[int]]) -> Callable[..., None]:
    """An original body that polls its chunked request's sender as check_bootstrap does (by the name the
    prefill module binds, at call time)."""
    from sglang.srt.disaggregation import prefill

    def body(self: Any, last_batch: Any = None, running_batch: Any = None) -> None:
        reqs = [self.chunked_req] if self.chunked_req is not None else list(self.waiting_queue)
        seen.append(prefill.poll_and_all_reduce_attn_cp_tp_group([r.disagg_kv_sender for r in reqs], None, None))

    return body


def _scheduler(chunked: Any = None, waiting: list[Any] | None = None) -> Any:
    return SimpleNamespace(chunked_req=chunked, waiting_queue=waiting or [], attn_cp_cpu_group="cp",
                           attn_tp_cpu_group="tp")


def test_a_rank_without_a_chunked_request_still_enters_the_chunk_exchange(peers: Any) -> None:
    others, ledger = peers
    others.append([(lockstep.request_key("c"), BOOTSTRAPPING)])  # the peer still chunks `c`
    ran: list[str] = []
    chunk = _patched(lockstep.PROCESS_PREFILL_CHUNK, lambda self, **kw: ran.append("body"))
    chunk(_scheduler(chunked=None), last_batch=None, running_batch=None)
    assert ran == ["body"]
    assert ledger.entered == [phases.Phase.PREFILL_CHUNK_BOOTSTRAP_EXCHANGE]


@pytest.mark.parametrize(("peer_sent", "local", "agreed"), [
    ([], BOOTSTRAPPING, FAILED),  # the peer dropped its chunked request on its own
    ([(lockstep.request_key("c"), BOOTSTRAPPING)], WAITING, BOOTSTRAPPING),  # both chunk it: the smaller state
], ids=["a-peer-lacks-it", "every-rank-holds-it"])
def test_check_bootstraps_poll_reads_the_agreed_state_of_the_chunked_request(
    peers: Any, peer_sent: list[tuple[int, int]], local: int, agreed: int
) -> None:
    others, _ = peers
    others.append(peer_sent)
    seen: list[list[int]] = []
    req = SimpleNamespace(rid="c", pending_bootstrap=True, disagg_kv_sender=_Sender(local))
    _patched(lockstep.PROCESS_PREFILL_CHUNK, _body_polls(seen))(_scheduler(chunked=req), last_batch=None,
                                                                 running_batch=None)
    assert seen == [[agreed]]


def test_the_waiting_queue_exchange_is_entered_on_an_empty_queue_and_fails_what_a_peer_lacks(peers: Any) -> None:
    others, ledger = peers
    others.append([(lockstep.request_key("a"), WAITING)])  # the peer lost `b`
    seen: list[list[int]] = []
    waiting = [SimpleNamespace(rid=rid, to_finish=None, finished_reason=None, disagg_kv_sender=_Sender(WAITING))
               for rid in "ab"]
    resolve = _patched(lockstep.RESOLVE_WAITING_BOOTSTRAP, _body_polls(seen))
    resolve(_scheduler(waiting=waiting))
    assert seen == [[WAITING, FAILED]]
    resolve(_scheduler(waiting=[]))
    assert ledger.entered == [phases.Phase.PREFILL_WAITING_BOOTSTRAP_EXCHANGE] * 2
