"""What holding streamed tool calls until their arguments are whole costs (docs/toolcalls.md), on DeepSeek V4's
production route: SGLang 0.5.23's real chat handler with `--tool-call-parser deepseekv4` (deepseek-recipe's
token-id parser, the offline V4 tokenizer of tests/support), one engine chunk per token, the guard (salvage on)
against the same handler without it, in the same process.

  delay:  per call, in tokens, when the client sees the call's first byte and when it has the call whole,
          guarded minus bare. The hold moves the first byte to the token that closes the arguments and must
          not move the whole call at all.
  cpu:    the handler's time to stream the corpus, guarded over bare (minimum over repeats: on a shared machine,
          the repeat least disturbed by other work).

    python benchmarks/bench_toolcall_hold.py [--responses N] [--repeats R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CITIES = ["Paris", "Oslo", "São Paulo", "Rio de Janeiro, Brazil", "Llanfairpwllgwyngyll, Wales", "東京"]


def corpus(responses: int, seed: int = 11) -> list[list[tuple[str, dict[str, Any]]]]:
    rng = random.Random(seed)
    return [[("get_weather", {"city": rng.choice(CITIES)}) for _ in range(rng.randint(1, 3))]
            for _ in range(responses)]


async def _stream(serving: Any, calls: list[tuple[str, dict[str, Any]]], rid: str) -> list[tuple[int, int]]:
    """Streams the output of `calls` a token a chunk; per call, the engine step of its first byte and the step
    at which its arguments became a JSON object, as the client sees them."""
    from tests.support import cut_calls, recipe_serving

    ids = recipe_serving.encode("Checking.\n\n" + recipe_serving.v4_markup(calls, cut_calls.TOOLS))
    manager = serving.tokenizer_manager
    manager.id_chunks[rid], manager.outputs[rid] = [[token] for token in ids], []
    steps = SimpleNamespace(n=0)
    original = manager.generate_request

    async def counted(adapted: Any, raw: Any = None) -> Any:
        async for out in original(adapted, raw):
            steps.n += 1
            yield out

    manager.generate_request = counted
    first: dict[int, int] = {}
    whole: dict[int, int] = {}
    arguments: dict[int, str] = {}
    request = cut_calls.request("stop", stream=True)
    async for event in serving._generate_chat_stream(SimpleNamespace(rid=rid), request, None):
        if not event.startswith("data: {"):
            continue
        for choice in json.loads(event[len("data: "):]).get("choices") or []:
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                index = call["index"]
                first.setdefault(index, steps.n)
                arguments[index] = arguments.get(index, "") + (call["function"].get("arguments") or "")
                if index not in whole and arguments[index].endswith("}"):
                    whole[index] = steps.n
    manager.generate_request = original
    return [(first[i], whole[i]) for i in sorted(first)]


def run(cls: type, outputs: list[list[tuple[str, dict[str, Any]]]]) -> tuple[float, list[list[tuple[int, int]]]]:
    from tests.support import cut_calls

    serving = cut_calls.handler(cls, cut_calls.ROUTES["v4-recipe"])
    start = time.perf_counter()
    seen = [asyncio.run(_stream(serving, calls, f"r{n}")) for n, calls in enumerate(outputs)]
    return time.perf_counter() - start, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--responses", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import pytest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    from tests.support import chat_serving, recipe_serving

    patch = pytest.MonkeyPatch()
    guarded = chat_serving.guarded_class(patch, salvage=True)
    recipe_serving.serving_settings(patch)
    outputs = corpus(args.responses)
    bare_s, bare = min((run(OpenAIServingChat, outputs) for _ in range(args.repeats)), key=lambda r: r[0])
    held_s, held = min((run(guarded, outputs) for _ in range(args.repeats)), key=lambda r: r[0])
    first = [h[0] - b[0] for hs, bs in zip(held, bare, strict=True) for h, b in zip(hs, bs, strict=True)]
    whole = [h[1] - b[1] for hs, bs in zip(held, bare, strict=True) for h, b in zip(hs, bs, strict=True)]
    print(f"calls: {len(first)} in {len(outputs)} streams, one token a chunk")
    print(f"delay of a call's first byte: mean {statistics.mean(first):.1f} tokens, max {max(first)} "
          f"(at 20 ms a token: {20 * statistics.mean(first):.0f} ms)")
    print(f"delay of a whole call: mean {statistics.mean(whole):.1f} tokens, max {max(whole)}")
    print(f"handler cpu: bare {1000 * bare_s / len(outputs):.2f} ms a stream, guarded "
          f"{1000 * held_s / len(outputs):.2f} ms ({100 * (held_s / bare_s - 1):+.1f}%)")
    patch.undo()


if __name__ == "__main__":
    main()
