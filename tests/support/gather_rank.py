"""One rank of a two-rank gloo group that enters one of SGLang's object all-gathers from its real caller, with the
rank instrumentation installed: `python -m tests.support.gather_rank LEDGER RANK PORT grammar|vmm`.

Rank 1 enters only after a line arrives on its stdin, so the test can watch rank 0 wait in the gather alone.
Each rank then runs one all-gather of its own (a caller outside the audit, left unmarked) and prints what the
SGLang function returned, as JSON.

What is SGLang's own code: `GrammarManager` (constructor and `get_ready_grammar_requests`, with its real XGrammar
backend compiling a JSON schema on a thread), `Req`, `SamplingParams`, `Scheduler._gather_vmm_materialization_errors`
and torch's `all_gather_object`. What stands in: the scheduler the grammar manager reads its settings from (a
namespace: its constructor loads a model), with a word-level tokenizer built here (no model files offline) and
the gloo WORLD group as its dp-TP CPU group; for the VMM gather, a `Scheduler` made with `object.__new__`, given
only that group, because `Scheduler.__init__` needs a model and a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from types import SimpleNamespace
from typing import Any

import torch.distributed as dist

from pdfleet.runtime import engine_setup
from pdfleet.runtime.health import attach
from pdfleet.runtime.instrument import seams

WORLD = 2
SCHEMA = '{"type": "object"}'
VMM_ERRORS = (None, "ValueError: feature 3 is missing")  # each rank's own materialization outcome


def publish_context() -> Any:
    """SGLang's process-wide config for a TP-2 CPU server with the XGrammar backend, on PP stage 0; returns
    its server args."""
    from sglang.srt import runtime_context
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(
        ["--model-path", "dummy", "--device", "cpu", "--tp-size", str(WORLD), "--grammar-backend", "xgrammar"]))
    server_args.resolve_once()
    runtime_context.publish(server_args, role="test")
    get_parallel().override_permanently(pp_rank=0, pp_size=1)
    return server_args


def tokenizer() -> Any:
    """A character-level tokenizer over what a JSON object needs: enough for XGrammar to compile a schema."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<eos>", "{", "}", '"', ":", ",", " ", "a", "b", "1", "[", "]"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def grammar_gather(rank: int, server_args: Any) -> tuple[list[str], int]:
    """The rids `get_ready_grammar_requests` moves on once the ranks' ready sets are gathered, and how many
    calls (each one gather) that took."""
    from sglang.srt.constrained.grammar_manager import GrammarManager
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    tok = tokenizer()
    scheduler = SimpleNamespace(
        server_args=server_args, tokenizer=tok,
        model_config=SimpleNamespace(vocab_size=len(tok), hf_eos_token_id={0}, think_end_ids=None),
        dp_tp_cpu_group=dist.group.WORLD,
        dp_tp_group=SimpleNamespace(world_size=WORLD, first_rank=0, is_first_rank=rank == 0),
        pp_group=None,
    )
    manager = GrammarManager(scheduler)  # type: ignore[arg-type]
    req = Req("grammar-req", "", [1, 2], SamplingParams(json_schema=SCHEMA))
    assert manager.process_req_with_grammar(req)
    ready: list[Any] = []
    calls = 0
    while not ready:  # a rank whose compile is still running gathers an empty ready set: every rank calls again
        ready = manager.get_ready_grammar_requests()
        calls += 1
    return [r.rid for r in ready], calls


def vmm_gather(rank: int) -> tuple[list[str | None], int]:
    from sglang.srt.managers.scheduler import Scheduler

    scheduler = object.__new__(Scheduler)
    scheduler.dp_tp_cpu_group = dist.group.WORLD
    return scheduler._gather_vmm_materialization_errors(VMM_ERRORS[rank]), 1


def main() -> None:
    path, rank, port, which = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    server_args = publish_context()
    engine_setup.apply_selected([])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    seams.use(attach.attach_rank(slot=rank, rank=rank, slots=WORLD, path=path, stack_signal=None))
    if rank == 1:
        sys.stdin.readline()
    result, gathers = grammar_gather(rank, server_args) if which == "grammar" else vmm_gather(rank)
    unaudited: list[Any] = [None] * WORLD
    dist.all_gather_object(unaudited, rank)
    dist.destroy_process_group()
    print(json.dumps({"result": result, "gathers": gathers, "unaudited": unaudited}))


if __name__ == "__main__":
    main()
