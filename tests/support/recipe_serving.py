"""SGLang 0.5.23's real OpenAI chat handler serving DeepSeek V4 as it does in production: `--tool-call-parser
deepseekv4` selects the `dsv4` chat encoding, whose output side is deepseek-recipe's token-id stream parser
(`DeepSeekRecipeChatEncodingAdapter`, `DeepSeekRecipeOutputParser`), fed the engine's output ids.

No checkpoint is needed: recipe only reads the tokenizer's `tokenizer.json`, and parses DSML by the id of the
`｜DSML｜` special token. The tokenizer here is built offline with the `tokenizers` library: byte-level (every
UTF-8 byte is a token, so any text encodes and a character may be split across chunks, as a real BPE splits
them) plus V4's special tokens as recipe spells them, wrapped as the `PreTrainedTokenizerFast` SGLang would
load. V4's call markup comes from recipe's own prompt encoder (`v4_markup`), never written by hand here.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import chat_serving
from tests.support.requires import module

V4_PARSER = "deepseekv4"
MODEL = "DeepSeek-V4-Pro"  # recipe's model name for the dsv4 spec


@functools.cache
def v4_tokenizer() -> Any:
    """A byte-level `PreTrainedTokenizerFast` with every special token recipe and SGLang's V4 glue name."""
    recipe = module("deepseek_recipe")
    from sglang.srt.parser.deepseek_recipe_renderer import IMAGE_TOKEN, TASK_TOKENS
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: n for n, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    spelling = recipe.SpecialTokens()
    kinds = [getattr(recipe.SpecialToken, name) for name in dir(recipe.SpecialToken) if name[0].isupper()]
    # SGLang's own additions: the checkpoint's image token and the quick-instruction task tokens.
    specials = sorted({spelling.token(kind) for kind in kinds} | {IMAGE_TOKEN, *TASK_TOKENS.values()})
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=spelling.token(recipe.SpecialToken.Bos),
                                   eos_token=spelling.token(recipe.SpecialToken.Eos))


def encode(text: str) -> list[int]:
    """The ids a model sampling `text` produces: special-token spellings become their special token."""
    return list(v4_tokenizer().encode(text, add_special_tokens=False))


def v4_markup(calls: Sequence[tuple[str, dict[str, Any]]], tools: Sequence[dict[str, Any]]) -> str:
    """The text a V4 model writes for `calls` (after any content): recipe's encoder renders an assistant turn with
    these calls into a prompt, and the turn's tail between the content and end-of-sentence is cut out."""
    recipe = module("deepseek_recipe")
    tool_calls = [{"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                  for n, (name, args) in enumerate(calls)]
    request = {"model": MODEL, "thinking": {"type": "disabled"}, "tools": list(tools), "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": tool_calls},
        *({"role": "tool", "tool_call_id": call["id"], "content": "ok"} for call in tool_calls)]}
    conversation = recipe.ChatCompletionRequest(request).convert(recipe.ConversionOptions()).conversation
    prompt = recipe.DeepseekV4Encoding().render_conversation(conversation).prompt
    spelling, kind = recipe.SpecialTokens(), recipe.SpecialToken
    turn = prompt.split(spelling.token(kind.Assistant) + spelling.token(kind.ThinkingEnd))[1]
    return turn.split(spelling.token(kind.Eos))[0].strip()


def serving_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`chat_serving.serving_settings`, plus what the recipe adapter reads: the model's revision and the
    serving settings its stream reads through its own module's `get_serving`."""
    from sglang.srt.entrypoints.openai import serving_chat, serving_deepseek_recipe

    chat_serving.serving_settings(monkeypatch)
    monkeypatch.setattr(serving_chat, "get_model", lambda: SimpleNamespace(revision=None))
    monkeypatch.setattr(serving_deepseek_recipe, "get_serving", serving_chat.get_serving)


class V4TokenizerManager(chat_serving.FakeTokenizerManager):
    """A V4 checkpoint's tokenizer manager: the offline V4 tokenizer, a DeepseekV4 architecture, and engine
    chunks that carry output ids (what recipe parses) as well as their text (what the text path reads)."""

    def __init__(self, tool_call_parser: str | None) -> None:
        super().__init__(tool_call_parser)
        self.tokenizer = v4_tokenizer()
        self.model_config = SimpleNamespace(get_default_sampling_params=lambda: {}, hf_config=SimpleNamespace(
            model_type="deepseek_v4", architectures=["DeepseekV4ForCausalLM"]))
        self.id_chunks: dict[str, list[list[int]]] = {}

    async def generate_request(self, adapted: Any, raw_request: Any = None) -> AsyncIterator[dict[str, Any]]:
        """One request's engine chunks, cumulative as SGLang streams them by default; between chunks the event
        loop runs others, as it does while the real one awaits the detokenizer, so concurrent streams interleave."""
        chunks = self.id_chunks[adapted.rid]
        ids: list[int] = []
        for n, piece in enumerate(chunks):
            ids = ids + list(piece)
            finish = dict(self.finishes.get(adapted.rid, chat_serving.STOP)) if n == len(chunks) - 1 else None
            yield {"text": self.tokenizer.decode(ids), "output_ids": ids, "index": 0, "meta_info": {
                "id": adapted.rid, "finish_reason": finish, "prompt_tokens": 3, "completion_tokens": len(ids),
                "cached_tokens": 0, "weight_version": "default"}}
            await asyncio.sleep(0)


def v4_handler(cls: type, tool_call_parser: str | None = V4_PARSER) -> Any:
    """`cls` (OpenAIServingChat or the guarded subclass) over a V4TokenizerManager; `serving_settings` first."""
    return cls(V4TokenizerManager(tool_call_parser), chat_serving.template_manager())


async def v4_stream(serving: Any, request: Any, id_chunks: Sequence[Sequence[int]], rid: str,
                    finish: dict[str, Any] = chat_serving.STOP) -> dict[str, Any]:
    """`chat_serving.stream` with the engine's output given as chunks of token ids."""
    serving.tokenizer_manager.id_chunks[rid] = [list(c) for c in id_chunks]
    serving.tokenizer_manager.outputs[rid] = []
    return await chat_serving.stream(serving, request, [], rid, finish)


def v4_respond(serving: Any, request: Any, ids: Sequence[int], rid: str = "req-1",
               finish: dict[str, Any] = chat_serving.STOP) -> Any:
    """The non-streaming response to `request` whose engine output was `ids`, ended by `finish`."""
    import time

    text = serving.tokenizer_manager.tokenizer.decode(list(ids))
    ret = [{"text": text, "output_ids": list(ids), "meta_info": {
        "id": rid, "finish_reason": dict(finish), "prompt_tokens": 3, "completion_tokens": len(ids),
        "cached_tokens": 0, "weight_version": "default"}}]
    return serving._build_chat_response(request, ret, int(time.time()))
