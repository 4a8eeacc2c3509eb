"""grammar-consensus: a grammar outcome decided on one tensor-parallel rank is acted on by every rank of the group.

SGLang's own grammar code runs on a real gloo group of two ranks (tests/support/grammar_rank.py): the ready-grammar
poll with its cache, and the result processor's FSM advance. The second rank is the odd one out, as a rank-local
failure makes it: its first compile of one grammar raises, and its grammar rejects one sampled token. Without the
patch the ranks disagree on which requests run (the divergence that leaves them with different batches, then
hangs the next forward's collectives); with it they agree, and a grammar that failed on one rank only is compiled
afresh for the next request instead of staying poisoned in that rank's cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pdfleet.runtime.patches import base, catalogue, registry, targets
from pdfleet.runtime.patches.impl import grammar_consensus as GC
from tests.support import forkserver
from tests.support.ports import free_port

COMPILE_FAILED = "aborted: Failed to compile regex grammar: Grammar compilation failed: the compile thread ran out " \
                 "of memory"
SPLIT = f"aborted: Failed to compile regex grammar: {GC.SPLIT_COMPILE}"


def run_ranks(patched: bool, logs: Path) -> list[dict[str, Any]]:
    port = free_port()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "PYTHONWARNINGS": "ignore"}
    ranks = [forkserver.shared().spawn("tests.support.grammar_rank", (str(rank), "2", str(port), str(int(patched))),
                                       env=env, log=logs / f"rank-{rank}.log") for rank in range(2)]
    for rank, proc in enumerate(ranks):
        assert proc.wait(timeout=180) == 0, (logs / f"rank-{rank}.log").read_text()[-3000:]
    return [json.loads((logs / f"rank-{rank}.log").read_text().strip().splitlines()[-1]) for rank in range(2)]


@pytest.fixture(scope="module")
def unpatched(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(False, tmp_path_factory.mktemp("unpatched"))


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(True, tmp_path_factory.mktemp("patched"))


def test_unpatched_a_compile_failure_on_one_rank_aborts_there_alone_and_poisons_its_cache(
        unpatched: list[dict[str, Any]]) -> None:
    first, odd = (rank["compile"] for rank in unpatched)
    assert first["fates"] == {"r1-flaky": "running", "r2-ok": "running", "r3-flaky-again": "running"}
    assert odd["fates"] == {"r1-flaky": COMPILE_FAILED, "r2-ok": "running", "r3-flaky-again": COMPILE_FAILED}


def test_patched_a_grammar_that_compiled_on_some_ranks_only_is_aborted_on_all_and_compiled_afresh_next_time(
        patched: list[dict[str, Any]]) -> None:
    for rank in patched:
        assert rank["compile"]["fates"] == {"r1-flaky": SPLIT, "r2-ok": "running", "r3-flaky-again": "running"}
        assert rank["compile"]["queued"] == [True, True, True], "the next request compiles, on every rank"


def test_unpatched_a_token_one_rank_s_grammar_rejects_aborts_the_request_there_alone(
        unpatched: list[dict[str, Any]]) -> None:
    first, odd = (rank["accept"] for rank in unpatched)
    assert first == {"a0": "running", "a1": "running", "a2": "running"}
    assert odd == {"a0": "running", "a1": "aborted: Grammar accept_token failed: token 7 is not allowed here",
                   "a2": "running"}


def test_patched_every_rank_aborts_the_request_any_rank_s_grammar_rejected(patched: list[dict[str, Any]]) -> None:
    first, odd = (rank["accept"] for rank in patched)
    assert first == {"a0": "running", "a1": f"aborted: Grammar accept_token failed: {GC.PEER_REJECTED}",
                     "a2": "running"}
    assert odd["a1"] == "aborted: Grammar accept_token failed: token 7 is not allowed here"
    assert {odd["a0"], odd["a2"]} == {"running"}


def test_an_accept_acted_on_at_once_raises_on_every_rank_when_one_rejects(patched: list[dict[str, Any]]) -> None:
    first, odd = (rank["accept_at_once"] for rank in patched)
    assert first == ["accepted", f"rejected: {GC.PEER_REJECTED}", "accepted", "finished=True"]
    assert odd == ["accepted", "rejected: token 7 is not allowed here", "accepted", "finished=True"]


# --- the wrappers, each with SGLang's part replaced by a recording stand-in ---------------------------------------

def _wrappers(calls: list[str], monkeypatch: pytest.MonkeyPatch, **originals: Any) -> dict[str, Any]:
    """The patch's replacements around stand-in originals, with a reduction that records its inputs and answers
    as if every peer agreed with this rank."""
    def reduce_min(values: list[int], group: Any) -> list[int]:
        calls.append(f"reduce {list(values)} over {group}")
        return list(values)

    monkeypatch.setattr(GC.gloo_min, "all_min", reduce_min)
    noop = {t: (lambda *a, **k: None) for t in GC.TARGETS}
    return GC.replacements({**noop, **originals})


def _req(rid: str, grammar: Any = None) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, grammar=grammar, to_finish=None, finished=lambda: False)


def test_a_disaggregated_prefill_sees_agreeing_grammars_and_gets_its_own_back(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    grammar = SimpleNamespace(accept_token=lambda token: calls.append(f"accept {token}"), finished=False)
    reqs = [_req("g", grammar), _req("plain")]

    def original(scheduler: Any, batch: Any, result: Any) -> str:
        assert isinstance(reqs[0].grammar, GC.AgreedAccept) and reqs[1].grammar is None
        reqs[0].grammar.accept_token(5)
        reqs[0].grammar.finished = True
        return "processed"

    wrappers = _wrappers(calls, monkeypatch, **{GC.DISAGG_PREFILL_RESULT: original})
    scheduler = SimpleNamespace(dp_tp_cpu_group="tp")
    assert wrappers[GC.DISAGG_PREFILL_RESULT](scheduler, SimpleNamespace(reqs=reqs), None) == "processed"
    assert reqs[0].grammar is grammar and grammar.finished is True
    assert calls == ["accept 5", "reduce [1] over tp"]


def test_batch_results_are_agreed_once_where_no_other_site_agreed_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.disaggregation.utils import DisaggregationMode

    calls: list[str] = []
    wrappers = _wrappers(calls, monkeypatch, **{GC.PROCESS_BATCH_RESULT: lambda s, b, r: calls.append("processed")})
    batch = SimpleNamespace(reqs=[_req("g", object()), _req("plain")])

    def process(mode: Any, advanced: bool) -> list[str]:
        calls.clear()
        scheduler = SimpleNamespace(dp_tp_cpu_group="tp", disaggregation_mode=mode)
        wrappers[GC.PROCESS_BATCH_RESULT](scheduler, batch, SimpleNamespace(grammar_advanced=advanced))
        return list(calls)

    assert process(DisaggregationMode.DECODE, False) == ["processed", "reduce [1] over tp"]
    assert process(DisaggregationMode.NULL, False) == ["processed", "reduce [1] over tp"]
    assert process(DisaggregationMode.DECODE, True) == ["processed"], "advance_grammar_fsm agreed them"
    assert process(DisaggregationMode.PREFILL, False) == ["processed"], "each accept was agreed as it happened"
    batch.reqs = [_req("plain")]
    assert process(DisaggregationMode.DECODE, False) == ["processed"], "no grammar request, no collective"


def test_a_prebuilt_batch_is_agreed_before_its_results_release_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    batch = SimpleNamespace(reqs=[_req("g", object())])
    wrappers = _wrappers(calls, monkeypatch, **{GC.NEW_PREBUILT_BATCH: lambda s, running: batch if running else None})
    scheduler = SimpleNamespace(dp_tp_cpu_group="tp")
    assert wrappers[GC.NEW_PREBUILT_BATCH](scheduler, "running") is batch
    assert wrappers[GC.NEW_PREBUILT_BATCH](scheduler, None) is None
    assert calls == ["reduce [1] over tp"]


def test_the_split_of_compile_outcomes_needs_one_reduction() -> None:
    peers = [[1, 0, 0, 1], [1, 1, 0, 0]]  # two peers' "compiled" flags for four requests
    calls = []

    def reduce_min(values: list[int], group: Any) -> list[int]:
        calls.append(group)
        encoded = [[*p, *(-f for f in p)] for p in peers]  # what each peer sends: its flags, then their negations
        return [min(v, *(e[i] for e in encoded)) for i, v in enumerate(values)]

    assert GC.split_compiles([True, True, False, True], "tp", reduce_min) == [False, True, False, True]
    assert calls == ["tp"]
    assert GC.split_compiles([True, True, False, False], "tp", lambda v, g: list(v)) == [False, False, False, False]


def test_it_installs_on_the_installed_sglang_next_to_the_other_fixes() -> None:
    entry = catalogue.BY_ID[GC.PATCH_ID]
    assert entry.targets == GC.TARGETS and entry.recommended
    assert GC.PATCH_ID in catalogue.recommended_for("0.5.23")
    for dotted in GC.TARGETS:
        assert targets.fingerprint(targets.resolve(dotted).function) == GC.FINGERPRINTS["0.5.23"][dotted], dotted
    assert set(registry.implementations([GC.PATCH_ID])) == {GC.PATCH_ID}
    base.check(catalogue.recommended_for("0.5.23"), "0.5.23")
