"""Streams requests through the real `DetokenizerManager.handle_batch_token_id_out` of whichever SGLang is first
on sys.path, and prints what each request received, as JSON. Run as a script (see tests/support/sglang_release.py):
one process per SGLang release, because two releases cannot share an interpreter.

The tokenizer is built offline with the `tokenizers` library: a word-level vocabulary whose tokens decode to
themselves (Fuse decoder), DeepSeek's `｜DSML｜` marker, beginning- and end-of-sentence as special tokens, and
wrapped as the transformers `PreTrainedTokenizerFast` that SGLang's `get_tokenizer` would return.

Input (argv[1], JSON): {"patch": bool, "kernel_stand_in": bool, "scenarios": {name: {"disable_batch_decode": bool,
"requests": [{"rid", "tokens": [str], "skip_special_tokens", "spaces_between_special_tokens"}], "chunks": [int]}}}.
In a scenario every step sends each unfinished request its next `chunks[step % len]` tokens, all requests in one
batch in the order given; the last chunk ends with end-of-sentence, the stop token. Output: {"sglang",
"sglang_file", "applied", "results": {name: {"texts": {rid: text}, "steps": [{rid: text sent at that step}]}}}.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import json
import sys
import types
from typing import Any

DSML = "｜DSML｜"
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
SPECIAL = (DSML, BOS, EOS)
PROMPT_TAIL = "Assistant:"  # the prompt token SGLang sends with a request's first ids, for incremental decoding


class _KernelStandIn(types.ModuleType):
    """An attribute of the CUDA kernel package: importable, failing if anything calls it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self.__name__}.{name}")


class _Unavailable:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> _Unavailable:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} belongs to the CUDA kernel package, which this CPU test lacks")


class _KernelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Releases before 0.5.8 import `sgl_kernel` (a CUDA-only wheel of several hundred MB) at module level on the
    way to the detokenizer, never calling it there; this answers those imports."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "sgl_kernel" or fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _KernelStandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def build_tokenizer(words: list[str]) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate(["<unk>", *dict.fromkeys(words)])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, unk_token="<unk>")


def batch(io_struct: Any, counts: dict[str, list[int]], **values: Any) -> Any:
    """A BatchTokenIDOutput of this release (a dataclass before 0.5.8, a msgspec Struct in 0.5.23): `values`, the
    token counts this release has fields for, None for the rest."""
    fields = dict.fromkeys(inspect.signature(io_struct.BatchTokenIDOutput).parameters)
    unknown = set(values) - set(fields)
    if unknown:
        raise SystemExit(f"this SGLang's BatchTokenIDOutput lacks {sorted(unknown)}")
    return io_struct.BatchTokenIDOutput(**(fields | {k: v for k, v in counts.items() if k in fields} | values))


def install_patch_hooks() -> None:
    """What an engine process does (sitecustomize -> engine_setup): the patch is applied on import, before any
    SGLang code runs. The rank instrumentation, applied along with it in an engine, is fingerprinted for the main
    SGLang only and has nothing to do with the detokenizer, so it is left out here."""
    import os

    from pdfleet.runtime import engine_setup
    from pdfleet.runtime.instrument import apply as instrument

    os.environ["PDFLEET_PATCHES"] = "dsml-batch-decode-guard"
    engine_setup.ALWAYS_APPLIED = ()
    instrument.install = lambda version: engine_setup.base.Applied(id="rank instrumentation (left out)", targets=())
    engine_setup.install_from_environment()


def run(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["kernel_stand_in"]:
        sys.meta_path.insert(0, _KernelFinder())
    if spec["patch"]:
        install_patch_hooks()
    import sglang
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager

    patched_by = getattr(DetokenizerManager.handle_batch_token_id_out, "__pdfleet_patch__", None)
    applied = [patched_by] if patched_by else []
    results = {name: stream(scenario) for name, scenario in spec["scenarios"].items()}
    return {"sglang": sglang.__version__, "sglang_file": sglang.__file__, "applied": applied, "results": results}


def stream(spec: dict[str, Any]) -> dict[str, Any]:
    from sglang.srt.managers import detokenizer_manager, io_struct

    requests = spec["requests"]
    tokenizer = build_tokenizer([PROMPT_TAIL, *(t for r in requests for t in r["tokens"])])
    manager = object.__new__(detokenizer_manager.DetokenizerManager)  # no sockets, no model download
    manager.tokenizer = tokenizer
    manager.decode_status = detokenizer_manager.LimitedCapacityDict(capacity=1024)
    manager.is_dummy = False
    manager.is_tool_call_parser_gpt_oss = False
    manager.tool_close_token_ids = set()
    manager.vocab_size = len(tokenizer)
    manager.disable_tokenizer_batch_decode = spec["disable_batch_decode"]

    eos = tokenizer.convert_tokens_to_ids(EOS)
    pending = {r["rid"]: tokenizer.convert_tokens_to_ids([*r["tokens"], EOS]) for r in requests}
    sent = dict.fromkeys(pending, 0)
    texts = dict.fromkeys(pending, "")
    steps: list[dict[str, str]] = []
    step = 0
    while any(sent[rid] < len(ids) for rid, ids in pending.items()):
        live = [r for r in requests if sent[r["rid"]] < len(pending[r["rid"]])]
        size = spec["chunks"][step % len(spec["chunks"])]
        decode_ids, read_offsets, finished = [], [], []
        for r in live:
            ids, start = pending[r["rid"]], sent[r["rid"]]
            chunk = ids[start:start + size]
            sent[r["rid"]] = start + len(chunk)
            first = start == 0
            decode_ids.append(([tokenizer.convert_tokens_to_ids(PROMPT_TAIL)] if first else []) + chunk)
            read_offsets.append(1 if first else 0)
            finished.append({"type": "stop", "matched": eos} if sent[r["rid"]] == len(ids) else None)
        n = len(live)
        zeros = [0] * n
        counts = {"prompt_tokens": zeros, "completion_tokens": zeros, "cached_tokens": zeros, "reasoning_tokens": zeros}
        out = manager.handle_batch_token_id_out(batch(
            io_struct, counts,
            rids=[r["rid"] for r in live],
            http_worker_ipcs=[None] * n,
            finished_reasons=finished,
            decoded_texts=[""] * n,
            decode_ids=decode_ids,
            read_offsets=read_offsets,
            output_ids=None,
            skip_special_tokens=[r["skip_special_tokens"] for r in live],
            spaces_between_special_tokens=[r["spaces_between_special_tokens"] for r in live],
            no_stop_trim=[False] * n,
        ))
        for rid, text in zip(out.rids, out.output_strs, strict=True):
            texts[rid] += text
        steps.append(dict(zip(out.rids, out.output_strs, strict=True)))
        step += 1
    return {"texts": texts, "steps": steps}


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
