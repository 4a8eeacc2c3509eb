"""`dsml-leak-guard`: no DeepSeek DSML tool-call markup in OpenAI chat content, whatever leaked it.

Why. Markup reaches `content` for causes outside the parser's reach: special tokens decoded away in a mixed
batch, the parser off while the model still calls (`tool_choice: "none"`), a template emitting the other
version's markers, a call the parser refused (see `pdfleet.runtime.toolcalls.markup.Cause`). The guard
watches the text SGLang is about to send, counts every leak by cause, logs a sample a minute with the
request id, and with salvage on (`PDFLEET_TOOLCALL_SALVAGE=1` in the engine's environment, e.g. the pool's
`spec.engine.env`) turns well-formed calls into `tool_calls` and withholds the rest of the markup. An output cut
inside its calls (max tokens, a stop string, an abort) gets one answer streamed or not, whichever parser route
served it: the calls complete before the cut, never one whose arguments are not JSON, the engine's finish reason
(`runtime/toolcalls/cut.py`, `hold.py`; docs/toolcalls.md).

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

from pdfleet.runtime.toolcalls.cut import complete_calls, cut_region, finish_reason, json_object, leaks
from pdfleet.runtime.toolcalls.markup import EXPECTED_BLOCK, INVOKE
from pdfleet.runtime.toolcalls.report import Reporter
from pdfleet.runtime.toolcalls.salvage import Call
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


def guard_non_streaming(serving: Any, request: Any, response: Any, request_id: str,
                        outputs: list[tuple[str, str | None]]) -> Any:
    """Guards each choice of a ChatCompletionResponse in place; anything else (an error) passes. `outputs`:
    each choice's raw output text and the engine's finish reason, as they were before SGLang's parsers."""
    choices = getattr(response, "choices", None)
    if not choices:
        return response
    context = context_for(serving, request, salvage=serving.pdfleet_salvage)
    for choice, (output, engine_finish) in zip(choices, outputs, strict=False):
        cut_short = settle_cut(serving, choice, output, engine_finish, context, request_id)
        message = choice.message
        if not message.content:
            continue
        step = scan(message.content, context)
        serving.pdfleet_reporter.record(step.leaks, request_id)
        if not context.salvage:
            continue
        message.content = step.text
        if step.calls:
            append_calls(message, step.calls, request_id)
            if choice.finish_reason == "stop" and not cut_short:
                choice.finish_reason = "tool_calls"
    return response


def settle_cut(serving: Any, choice: Any, output: str, engine_finish: str | None, context: Context,
               request_id: str) -> bool:
    """The contract for an output cut inside a call block (`toolcalls.cut`) on one choice: SGLang's calls whose
    arguments are not a JSON object withheld, the calls complete before the cut returned (SGLang's text
    detectors drop the whole block), the engine's finish reason kept. Whether the output was cut."""
    if not context.parsing_active:
        return False
    found = cut_region(output)
    message = choice.message
    calls = list(message.tool_calls or [])
    broken = [c.function.arguments or "" for c in calls if not json_object(c.function.arguments or "")]
    serving.pdfleet_reporter.record(leaks(found, broken, salvage=context.salvage), request_id)
    if not context.salvage:
        return found is not None
    kept = [c for c in calls if json_object(c.function.arguments or "")]
    if found is not None:  # a call is whole when its invoke closed: recipe returns one whose parameters did
        kept = kept[:found.region.count(f"</{found.opener.prefix}{INVOKE}>")]
    for n, call in enumerate(kept):
        call.index = n
    message.tool_calls = kept or None
    if found is not None and not calls:
        append_calls(message, complete_calls(found, context.tools), request_id)
    choice.finish_reason = finish_reason(choice.finish_reason, engine_finish, cut=found is not None,
                                         calls=len(message.tool_calls or []))
    return found is not None


def append_calls(message: Any, calls: list[Call], request_id: str) -> None:
    """`calls` as `tool_calls` after the message's own, numbered on from them."""
    if not calls:
        return
    from sglang.srt.entrypoints.openai.protocol import FunctionResponse, ToolCall

    existing = list(message.tool_calls or [])
    for n, call in enumerate(calls, start=len(existing)):
        existing.append(ToolCall(id=f"call_{request_id}_{n}", index=n,
                                 function=FunctionResponse(name=call.name, arguments=call.arguments)))
    message.tool_calls = existing


def incremental_streaming() -> bool:
    """Whether SGLang's engine chunks carry only their new text (`--incremental-streaming-output`)."""
    from sglang.srt.entrypoints.openai import serving_chat

    return bool(serving_chat.get_serving().incremental_streaming_output)


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
            # Read before SGLang's parsers: its text path rewrites the finish reason dict in place.
            outputs = [(str(item.get("text") or ""), (item["meta_info"].get("finish_reason") or {}).get("type"))
                       for item in ret]
            response = super()._build_chat_response(request, ret, created)
            request_id = str(ret[0]["meta_info"].get("id", "")) if ret else ""
            return guard_non_streaming(self, request, response, request_id, outputs)

        async def _generate_stream_content(self, **kwargs: Any) -> AsyncGenerator[str, None]:
            index, state_holder = kwargs["index"], kwargs["stream_offsets"]
            key = (_STATE_KEY, index)
            stream = state_holder.get(key)
            if stream is None:
                context = context_for(self, kwargs["request"], salvage=self.pdfleet_salvage)
                stream = state_holder[key] = ChoiceStream(StreamGuard(context))
                stream.incremental = incremental_streaming()
            stream.see(str(kwargs["content"].get("text") or ""), incremental=stream.incremental)
            async for chunk in super()._generate_stream_content(**kwargs):
                rewritten = stream.rewrite(chunk)
                if rewritten is not None:
                    yield rewritten
            request_id = str(kwargs["content"]["meta_info"].get("id", ""))
            ripe = stream.ripe(chunk_id=request_id, created=kwargs["created"], model=kwargs["request"].model,
                               index=index)
            if ripe is not None:
                yield ripe
            if stream.salvaged:
                kwargs["has_tool_calls"][index] = True
            if kwargs["finish_reason_type"] is not None:
                request = kwargs["request"]
                tail = stream.flush(chunk_id=request_id, created=kwargs["created"], model=request.model,
                                    index=index)
                if tail is not None:
                    yield tail
                # SGLang's closing chunk says `tool_calls` for a stop when this is set: not for a cut block
                # nor when every call it streamed was withheld.
                says_calls = stream.settle()
                if self.pdfleet_salvage:
                    kwargs["has_tool_calls"][index] = says_calls
            self.pdfleet_reporter.record(stream.take_leaks(), request_id)

    GuardedServingChat.__qualname__ = GuardedServingChat.__name__ = f"Guarded{base.__name__}"
    return GuardedServingChat


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    original = originals[SERVING_CHAT_CLASS]

    @functools.wraps(original)
    def serving_chat_class(self: Any) -> type:
        return guarded_class(original(self))

    return {SERVING_CHAT_CLASS: serving_chat_class}
