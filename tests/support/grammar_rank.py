"""One rank of a grammar-agreement check: SGLang's own grammar code (the ready-grammar poll and its cache, the
result processor's FSM advance) on a real gloo group, with or without pdfleet's grammar-consensus patch.

`python -m tests.support.grammar_rank RANK WORLD PORT PATCHED` prints, as JSON, what this rank did with each
request. The last rank is the odd one out, as a rank-local failure makes it: its first compile of the grammar
"flaky" raises (the compile thread ran out of memory, say), and its grammar rejects token 7 (an xgrammar
issue, or a token this rank alone sampled).
"""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace
from typing import Any

from tests.repro import stage


def main() -> None:
    rank, world, port = (int(a) for a in sys.argv[1:4])
    patched = sys.argv[4] == "1"
    import torch
    import torch.distributed as dist

    stage.publish_context(world, "decode")
    stage.set_rank(rank, world)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = dist.new_group(list(range(world)), backend="gloo")
    odd = rank == world - 1
    try:
        from sglang.srt.layers import dp_attention

        dp_attention.get_dp_tp_group = lambda: SimpleNamespace(cpu_group=group)  # no model groups in this process
        if patched:
            from pdfleet.runtime.patches import base, registry

            base.apply(["grammar-consensus"], "0.5.23", registry.implementations(["grammar-consensus"]))
        stories = {"compile": compile_story(group, world, odd), "accept": accept_story(odd, torch)}
        if patched:
            stories["accept_at_once"] = accept_at_once_story(group, odd)
        print(json.dumps(stories), flush=True)
    finally:
        dist.destroy_process_group()


def _grammar_class() -> type:
    from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject

    class Grammar(BaseGrammarObject):
        def __init__(self, rejects: frozenset[int]) -> None:
            super().__init__()
            self.rejects = rejects

        def accept_token(self, token: int) -> None:
            if token in self.rejects:
                raise ValueError(f"token {token} is not allowed here")

        def is_terminated(self) -> bool:
            return False

        def copy(self) -> Grammar:
            return Grammar(self.rejects)

    return Grammar


def _backend(odd: bool) -> Any:
    from sglang.srt.constrained.base_grammar_backend import BaseGrammarBackend

    grammar = _grammar_class()

    class Backend(BaseGrammarBackend):
        def __init__(self) -> None:
            super().__init__()
            self.compiles: dict[str, int] = {}

        def dispatch_regex(self, key_string: str) -> Any:
            self.compiles[key_string] = self.compiles.get(key_string, 0) + 1
            if odd and key_string == "flaky" and self.compiles[key_string] == 1:
                raise MemoryError("the compile thread ran out of memory")
            return grammar(frozenset())

    return Backend()


def _manager(group: Any, world: int, odd: bool) -> Any:
    from sglang.srt.constrained.grammar_manager import GrammarManager

    manager = object.__new__(GrammarManager)  # SGLang's constructor wants a scheduler; these are what it sets
    manager.grammar_backend, manager.grammar_queue, manager._enable_strict_thinking = _backend(odd), [], False
    manager.grammar_sync_group, manager.grammar_sync_size = group, world
    manager.pp_rank, manager.pp_size, manager.pp_group, manager.grammar_pp_sync_work_list = 0, 1, None, []
    manager.SGLANG_GRAMMAR_POLL_INTERVAL, manager.SGLANG_GRAMMAR_MAX_POLL_ITERATIONS = 0.05, 1_000_000
    return manager


def _req(rid: str, regex: str) -> Any:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid, "", [1, 2, 3], SamplingParams(regex=regex))


def _fate(req: Any) -> str:
    reason = req.to_finish or req.finished_reason
    return "running" if reason is None else f"aborted: {reason.message}"


def compile_story(group: Any, world: int, odd: bool) -> dict[str, Any]:
    """Two requests compile ("flaky" fails on the odd rank's first try), then a third asks for "flaky" again."""
    manager = _manager(group, world, odd)
    first = [_req("r1-flaky", "flaky"), _req("r2-ok", "ok")]
    queued_first = [manager.process_req_with_grammar(req) for req in first]
    _drain(manager)
    again = _req("r3-flaky-again", "flaky")
    queued_again = manager.process_req_with_grammar(again)
    _drain(manager)
    return {"queued": [*queued_first, queued_again], "fates": {r.rid: _fate(r) for r in [*first, again]}}


def _drain(manager: Any) -> None:
    deadline = time.monotonic() + 60
    while manager.has_waiting_grammars() and time.monotonic() < deadline:
        manager.get_ready_grammar_requests()


def accept_story(odd: bool, torch: Any) -> dict[str, str]:
    """A prefill batch of three grammar requests whose sampled tokens are 5, 7 and 9, through SGLang's own FSM
    advance (`advance_grammar_fsm`, the extend path); the odd rank's grammars reject token 7."""
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    grammar = _grammar_class()
    reqs = [_req(f"a{i}", "ok") for i in range(3)]
    for req in reqs:
        req.grammar = grammar(frozenset({7}) if odd else frozenset())
    batch = SimpleNamespace(reqs=reqs, has_grammar=True, forward_mode=SimpleNamespace(
        is_decode=lambda: False, is_extend=lambda: True))
    result = SimpleNamespace(grammar_advanced=False, copy_done=None, next_token_ids=torch.tensor([5, 7, 9]))
    processor = object.__new__(SchedulerBatchResultProcessor)
    processor.advance_grammar_fsm(result, batch)
    return {req.rid: _fate(req) for req in reqs}


def accept_at_once_story(group: Any, odd: bool) -> list[str]:
    """The patch's stand-in grammar, as a disaggregated prefill's results see it while the odd rank's grammar
    rejects token 7: what each accept of tokens 5, 7 and 9 did on this rank."""
    from pdfleet.runtime.patches.impl import gloo_min, grammar_consensus

    grammar = grammar_consensus.AgreedAccept(_grammar_class()(frozenset({7}) if odd else frozenset()), group,
                                             gloo_min.all_min)
    outcomes = []
    for token in (5, 7, 9):
        try:
            grammar.accept_token(token)
            outcomes.append("accepted")
        except ValueError as e:
            outcomes.append(f"rejected: {e}")
    grammar.finished = True  # reaches the grammar itself, as SGLang's `req.grammar.finished = ...` must
    outcomes.append(f"finished={grammar._grammar.finished}")
    return outcomes


if __name__ == "__main__":
    main()
