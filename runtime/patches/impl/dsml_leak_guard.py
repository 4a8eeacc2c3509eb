"""`dsml-leak-guard`: no DeepSeek DSML tool-call markup in OpenAI chat content, whatever leaked it.

Why. Markup reaches `content` for causes outside the parser's reach: special tokens decoded away in a mixed
batch, the parser off while the model still calls (`tool_choice: "none"`), a template emitting the other
version's markers, a call the parser refused (see `pdfleet.runtime.toolcalls.markup.Cause`). The guard
watches the text SGLang is about to send, counts every leak by cause, logs a sample a minute with the
request id, and with salvage on (`PDFLEET_TOOLCALL_SALVAGE=1` in the engine's environment, e.g. the pool's
`spec.engine.env`) turns well-formed calls into `tool_calls` and withholds the rest of the markup.

How, on SGLang 0.5.23. The HTTP server builds its chat handler from `TokenizerManager.serving_chat_class`
(a property); the replacement returns a subclass of whatever class that returns, which wraps:
- `_build_chat_response` (non-streaming): each choice's message content, after SGLang's own parsers;
- `_generate_stream_content` (streaming, one call per engine chunk of one choice): its SSE chunks, through
  one guard per choice kept in the stream's own `stream_offsets` dict (under a tuple key no int index can
  equal), flushed when the chunk carries the finish reason. A salvaged call sets `has_tool_calls[index]`,
  so SGLang's closing chunk says `finish_reason: "tool_calls"` as it does for calls its parser found.
The wrapped methods and their caller `_generate_chat_stream` are fingerprinted: the subclass relies on
how they are called and on what they return.
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from pdfleet.runtime.toolcalls.markup import EXPECTED_BLOCK
from pdfleet.runtime.toolcalls.report import Reporter
from pdfleet.runtime.toolcalls.sse import ChoiceStream
from pdfleet.runtime.toolcalls.stream import Context, StreamGuard, scan

PATCH_ID = "dsml-leak-guard"
SERVING_CHAT_CLASS = "sglang.srt.managers.tokenizer_manager.TokenizerManager.serving_chat_class"
BUILD_CHAT_RESPONSE = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._build_chat_response"
GENERATE_STREAM_CONTENT = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._generate_stream_content"
# Not wrapped, but relied on: it calls `_generate_stream_content` with keywords, once per chunk and choice,
# and turns `has_tool_calls` into the closing chunk's finish reason.
GENERATE_CHAT_STREAM = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._generate_chat_stream"
TARGETS = (SERVING_CHAT_CLASS, BUILD_CHAT_RESPONSE, GENERATE_STREAM_CONTENT, GENERATE_CHAT_STREAM)

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        SERVING_CHAT_CLASS: "f6f7810faba11510",
        BUILD_CHAT_RESPONSE: "be43ae6fe4e9cbe6",
        GENERATE_STREAM_CONTENT: "79f7a70477c0ddfd",
        GENERATE_CHAT_STREAM: "4a0f2529754d9a84",
    },
}

SALVAGE_ENV = "PDFLEET_TOOLCALL_SALVAGE"
_STATE_KEY = "pdfleet-dsml-guard"


def salvage_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(SALVAGE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def context_for(serving: Any, request: Any, *, salvage: bool) -> Context:
    """The guard's view of one request, from the handler's own decisions."""
    callable_tools = () if request.tool_choice == "none" else serving._effective_tools(request)
    return Context(
        parsing_active=serving._tool_call_parsing_active(request),
        expected_block=EXPECTED_BLOCK.get(serving.tool_call_parser or ""),
        tools=frozenset(t.function.name for t in callable_tools),
        salvage=salvage,
    )


def guard_non_streaming(serving: Any, request: Any, response: Any, request_id: str) -> Any:
    """Guards each choice of a ChatCompletionResponse in place; anything else (an error) passes."""
    choices = getattr(response, "choices", None)
    if not choices:
        return response
    from sglang.srt.entrypoints.openai.protocol import FunctionResponse, ToolCall

    context = context_for(serving, request, salvage=serving.pdfleet_salvage)
    for choice in choices:
        message = choice.message
        if not message.content:
            continue
        step = scan(message.content, context)
        serving.pdfleet_reporter.record(step.leaks, request_id)
        if not context.salvage:
            continue
        message.content = step.text
        if step.calls:
            existing = list(message.tool_calls or [])
            for n, call in enumerate(step.calls, start=len(existing)):
                existing.append(ToolCall(id=f"call_{request_id}_{n}", index=n,
                                         function=FunctionResponse(name=call.name, arguments=call.arguments)))
            message.tool_calls = existing
            if choice.finish_reason == "stop":
                choice.finish_reason = "tool_calls"
    return response


@functools.cache
def guarded_class(base: type) -> type:
    """`base` (OpenAIServingChat or a subclass of it) with the guard; one class per base."""

    class GuardedServingChat(base):  # type: ignore[misc, valid-type]
        pdfleet_salvage: bool = False
        pdfleet_reporter: Reporter

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.pdfleet_salvage = salvage_enabled()
            self.pdfleet_reporter = Reporter()

        def _build_chat_response(self, request: Any, ret: list[dict[str, Any]], created: int) -> Any:
            response = super()._build_chat_response(request, ret, created)
            request_id = str(ret[0]["meta_info"].get("id", "")) if ret else ""
            return guard_non_streaming(self, request, response, request_id)

        async def _generate_stream_content(self, **kwargs: Any) -> AsyncGenerator[str, None]:
            index, state_holder = kwargs["index"], kwargs["stream_offsets"]
            key = (_STATE_KEY, index)
            stream = state_holder.get(key)
            if stream is None:
                context = context_for(self, kwargs["request"], salvage=self.pdfleet_salvage)
                stream = state_holder[key] = ChoiceStream(StreamGuard(context))
            async for chunk in super()._generate_stream_content(**kwargs):
                rewritten = stream.rewrite(chunk)
                if rewritten is not None:
                    yield rewritten
            request_id = str(kwargs["content"]["meta_info"].get("id", ""))
            if kwargs["finish_reason_type"] is not None:
                request = kwargs["request"]
                tail = stream.flush(chunk_id=request_id, created=kwargs["created"], model=request.model,
                                    index=index)
                if tail is not None:
                    yield tail
            if stream.salvaged:
                kwargs["has_tool_calls"][index] = True
            self.pdfleet_reporter.record(stream.take_leaks(), request_id)

    GuardedServingChat.__qualname__ = GuardedServingChat.__name__ = f"Guarded{base.__name__}"
    return GuardedServingChat


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    original = originals[SERVING_CHAT_CLASS]

    @functools.wraps(original)
    def serving_chat_class(self: Any) -> type:
        return guarded_class(original(self))

    return {SERVING_CHAT_CLASS: serving_chat_class}
