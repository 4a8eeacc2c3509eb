"""SGLang 0.5.23's real OpenAI chat handler (`OpenAIServingChat`, or pdfleet's guarded subclass of it), built
without a model or a GPU, and fed engine output as `TokenizerManager.generate_request` would yield it.

The handler reads a few process-wide settings through `get_serving()`; `serving_settings` replaces that
lookup (a pytest monkeypatch) instead of publishing SGLang's runtime context, which is process-global.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
PING_TOOL = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}

STOP: dict[str, Any] = {"type": "stop"}  # the engine's finish reason when nothing else is said

_SERVING = dict(allow_auto_truncate=False, default_chat_template_kwargs=None, enable_cache_report=False,
                incremental_streaming_output=False, return_input_ids=False, return_output_ids=False,
                stream_response_default_include_usage=False, trust_request_chat_template=False)


def serving_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.entrypoints.openai import serving_chat

    settings = SimpleNamespace(**_SERVING)
    monkeypatch.setattr(serving_chat, "get_serving", lambda: settings)


def guarded_class(monkeypatch: pytest.MonkeyPatch, *, salvage: bool = True) -> type:
    """pdfleet's guarded subclass of the real handler, with `serving_settings` and salvage set."""
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    from pdfleet.runtime.patches.impl import dsml_leak_guard

    serving_settings(monkeypatch)
    monkeypatch.setenv(dsml_leak_guard.SALVAGE_ENV, "1" if salvage else "0")
    return dsml_leak_guard.guarded_class(OpenAIServingChat)


class FakeTokenizerManager:
    """What the handler's constructor and its two response paths read of a TokenizerManager."""

    server_args = None
    model_path = "dummy"

    def __init__(self, tool_call_parser: str | None) -> None:
        self._config = {"tool_call_parser": tool_call_parser, "reasoning_parser": None}
        self.tokenizer = SimpleNamespace(encode=lambda text: [], chat_template=None)
        self.model_config = SimpleNamespace(get_default_sampling_params=lambda: {},
                                            hf_config=SimpleNamespace(model_type="deepseek_v32"))
        self.outputs: dict[str, list[str]] = {}
        self.finishes: dict[str, dict[str, Any]] = {}  # a request's finish reason, if not a plain stop

    def config_value(self, name: str) -> Any:
        return self._config.get(name)

    async def generate_request(self, adapted: Any, raw_request: Any = None) -> AsyncIterator[dict[str, Any]]:
        """One request's engine chunks: cumulative text, as SGLang streams it by default."""
        chunks = self.outputs[adapted.rid]
        finish = self.finishes.get(adapted.rid, STOP)
        text = ""
        for n, piece in enumerate(chunks):
            text += piece
            last = n == len(chunks) - 1
            yield {"text": text, "index": 0, "meta_info": _meta(adapted.rid, n + 1, finish if last else None)}


def _meta(rid: str, tokens: int, finish: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": rid, "finish_reason": dict(finish) if finish else None, "prompt_tokens": 3,
            "completion_tokens": tokens, "cached_tokens": 0, "weight_version": "default"}


def template_manager() -> Any:
    """What the handler reads of a TemplateManager: no chat template of its own."""
    return SimpleNamespace(force_reasoning=False, chat_template_name=None, jinja_template_content_format=None)


def handler(cls: type, tool_call_parser: str | None = "deepseekv32", *, tokenizer: bool = True) -> Any:
    """`cls` over a FakeTokenizerManager; without `tokenizer`, as a server started with --skip-tokenizer-init."""
    manager = FakeTokenizerManager(tool_call_parser)
    if not tokenizer:
        manager.tokenizer = None
    return cls(manager, template_manager())


def chat_request(*, tools: Sequence[dict[str, Any]] = (), tool_choice: str | None = None,
                 stream: bool = False, **fields: Any) -> Any:
    """A chat request; `fields`: any other of its fields (`stop`, `max_tokens`)."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    extra: dict[str, Any] = {"tools": list(tools), **fields} if tools else dict(fields)
    if tool_choice is not None:
        extra["tool_choice"] = tool_choice
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], stream=stream, **extra)


def respond(serving: Any, request: Any, text: str, rid: str = "req-1", finish: dict[str, Any] = STOP) -> Any:
    """The non-streaming response to `request` whose engine output was `text`, ended by `finish`."""
    ret = [{"text": text, "meta_info": _meta(rid, 1, finish), "output_ids": [1]}]
    return serving._build_chat_response(request, ret, int(time.time()))


async def stream(serving: Any, request: Any, chunks: Sequence[str], rid: str,
                 finish: dict[str, Any] = STOP) -> dict[str, Any]:
    """Streams `chunks` (ended by `finish`) through the handler's real `_generate_chat_stream`; returns what a
    client assembles: content, tool calls (name, arguments) and the finish reason."""
    serving.tokenizer_manager.outputs[rid] = list(chunks)
    serving.tokenizer_manager.finishes[rid] = finish
    content, calls, indices, reason = "", [], [], None
    async for event in serving._generate_chat_stream(SimpleNamespace(rid=rid), request, None):
        if not event.startswith("data: {"):
            continue
        for choice in json.loads(event[len("data: "):]).get("choices") or []:
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                if fn.get("name"):
                    calls.append([fn["name"], fn.get("arguments") or ""])
                    indices.append(call.get("index"))
                elif calls:
                    calls[-1][1] += fn.get("arguments") or ""
            reason = choice.get("finish_reason") or reason
    return {"content": content, "calls": [tuple(c) for c in calls], "tool_indices": indices,
            "finish_reason": reason}


def v32_markup(calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """The text a V3.2 model writes for `calls` (after any content): SGLang's own V3.2 encoder (`encoding_dsv32`,
    the prompt side of `deepseekv32`) renders an assistant turn with these calls, and its end-of-sentence is cut."""
    from sglang.srt.entrypoints.openai import encoding_dsv32

    tool_calls = [{"type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                  for name, args in calls]
    turn = encoding_dsv32.render_message(0, [{"role": "assistant", "content": "", "tool_calls": tool_calls}],
                                         thinking_mode="chat")
    return turn.removesuffix(encoding_dsv32.eos_token).strip()
