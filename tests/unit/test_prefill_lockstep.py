"""kv-poll-lockstep on the prefill side (`prefill_lockstep`): the pure agreement over the attention-TP then
attention-CP exchanges, and the stand-in poll that hands the agreed states to SGLang's own body."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

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
