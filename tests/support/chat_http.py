"""SGLang 0.5.23's real chat handler served over HTTP on 127.0.0.1, in front of a deterministic stand-in model,
for clients that speak to a server (the tool-call canary's real `openai` client).

The routes do what SGLang's http_server does (less its content-type check): POST /v1/chat/completions hands
the parsed request to the serving object's `handle_request` and returns what it gives (SGLang's own
`model_json_response`), GET /v1/models lists the tokenizer manager's served model. uvicorn serves them from a
thread on a port the kernel picks.

The model answers each request from its HTTP body, the same way every time: a tool request (tools given,
`tool_choice` not "none") gets call markup for one of the request's tools, made by the version's own encoder
(`v32_markup`: SGLang's V3.2 encoder; `v4_markup`: deepseek-recipe's), a plain request gets plain text. The tool
and its arguments are the ones pdfleet's engine simulator picks. `leak` reproduces the mixed-batch decode leak:
the `｜DSML｜` markers gone from the output. Output is streamed in small pieces that cut markers anywhere, with
the event loop free between pieces, so concurrent requests interleave. The request's max_tokens cuts the output
where it ends (a character a token on the V3.2 path, a token id on V4's), finish reason `length`, as the engine
would.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from pdfleet.runtime.simulator import toolcalls
from pdfleet.runtime.simulator.faults import Fault
from pdfleet.runtime.toolcalls.markup import DSML
from tests.support import chat_serving, recipe_serving

MODEL = "canary-model"
PLAIN_ANSWER = "The sea is wide, and it keeps its secrets < 2 miles down."
PIECE = 7  # characters (V3.2) or token ids (V4) per engine chunk: cuts land inside markers, at varying places
CONTEXT_LEN = 65536
START_S = 30.0

Written = TypeVar("Written", str, list[int])  # what the model wrote: text (V3.2's path) or token ids (V4's)
Markup = Callable[[Sequence[tuple[str, dict[str, Any]]], Sequence[dict[str, Any]]], str]


@dataclasses.dataclass
class Model:
    """What the engine generates for a request body; `leak` switches the stripped-markers leak on."""

    markup: Markup
    leak: bool = False

    def output(self, body: Mapping[str, Any]) -> str:
        if not toolcalls.is_tool_request(body):
            return PLAIN_ANSWER
        call = toolcalls.answer(body, parser=None, fault=Fault.NONE, plain_alongside=False).call
        assert call is not None, "a healthy simulated answer is a structured call"
        text = self.markup([(call.name, json.loads(call.arguments))], body["tools"])
        return text.replace(DSML, "") if self.leak else text


def v32_model() -> Model:
    return Model(lambda calls, tools: chat_serving.v32_markup(calls))


def v4_model() -> Model:
    return Model(recipe_serving.v4_markup)


class _Http:
    """What SGLang's HTTP path reads of a TokenizerManager beyond what the handler tests' fakes give."""

    served_model_name = MODEL
    request_logger = SimpleNamespace(log_requests=False, log_requests_level=0)
    model: Model
    generating = 0
    peak = 0  # the most requests generating at once: proves they shared "batches"

    def _served(self, model: Model, architecture: str) -> None:
        self.model = model
        config = self.model_config  # type: ignore[attr-defined]
        config.is_multimodal, config.context_len = False, CONTEXT_LEN
        config.hf_config.architectures = [architecture]

    def create_abort_task(self, *args: Any, **kwargs: Any) -> None:
        return None  # nothing runs behind this handler to abort

    @staticmethod
    async def _body(adapted: Any, raw_request: Any) -> Mapping[str, Any]:
        # SGLang's TokenizerManager gives every request its id here; the handler reads it back from meta_info.
        adapted.normalize_batch_and_arguments()
        body: Mapping[str, Any] = await raw_request.json()  # read once by FastAPI already; starlette keeps it
        return body

    def _cut(self, adapted: Any, output: Written) -> Written:
        """`output` (characters or ids) as far as the request's max_tokens lets the engine write it; the finish
        reason `length` when it ran out."""
        limit = (adapted.sampling_params or {}).get("max_new_tokens")
        if limit is None or len(output) <= limit:
            return output
        self.finishes[adapted.rid] = {"type": "length", "length": limit}  # type: ignore[attr-defined]
        return output[:limit]

    async def _counted(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """`chunks`, with the request counted as generating until its last chunk (the one with a finish reason;
        a non-streaming request's only one) is handed over."""
        self.generating += 1
        self.peak = max(self.peak, self.generating)
        finished = False
        try:
            async for out in chunks:
                if out["meta_info"]["finish_reason"] is not None:
                    finished, self.generating = True, self.generating - 1
                yield out
        finally:
            if not finished:
                self.generating -= 1


class V32Engine(_Http, chat_serving.FakeTokenizerManager):
    """`--tool-call-parser deepseekv32`: the handler reads the engine's text."""

    def __init__(self, model: Model, tool_call_parser: str | None = "deepseekv32") -> None:
        super().__init__(tool_call_parser)
        # The V3.2 prompt is rendered by SGLang's encoder and must tokenize to something: its UTF-8 bytes.
        self.tokenizer = SimpleNamespace(encode=lambda text, **_: list(text.encode()), chat_template=None)
        self._served(model, "DeepseekV32ForCausalLM")

    async def generate_request(self, adapted: Any, raw_request: Any = None) -> AsyncIterator[dict[str, Any]]:
        text = self._cut(adapted, self.model.output(await self._body(adapted, raw_request)))
        # A non-streaming request takes the first chunk only, which SGLang's manager makes the whole output.
        self.outputs[adapted.rid] = [text[i:i + PIECE] for i in range(0, len(text), PIECE)] if adapted.stream \
            else [text]
        try:
            async for out in self._counted(super().generate_request(adapted, raw_request)):
                out["meta_info"]["completion_tokens"] = len(out["text"])  # a character a token, not a chunk
                yield out
                await asyncio.sleep(0)  # as the real manager awaits the detokenizer: other requests run
        finally:
            self.outputs.pop(adapted.rid, None)
            self.finishes.pop(adapted.rid, None)


class V4Engine(_Http, recipe_serving.V4TokenizerManager):
    """`--tool-call-parser deepseekv4`: deepseek-recipe parses the engine's output ids."""

    def __init__(self, model: Model, tool_call_parser: str | None = recipe_serving.V4_PARSER) -> None:
        super().__init__(tool_call_parser)
        self._served(model, "DeepseekV4ForCausalLM")

    async def generate_request(self, adapted: Any, raw_request: Any = None) -> AsyncIterator[dict[str, Any]]:
        ids = self._cut(adapted, recipe_serving.encode(self.model.output(await self._body(adapted, raw_request))))
        self.id_chunks[adapted.rid] = [ids[i:i + PIECE] for i in range(0, len(ids), PIECE)] if adapted.stream \
            else [ids]
        try:
            async for out in self._counted(super().generate_request(adapted, raw_request)):
                yield out
        finally:
            self.id_chunks.pop(adapted.rid, None)
            self.finishes.pop(adapted.rid, None)


def http_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`recipe_serving.serving_settings` (which includes the V3.2 handler's), plus the model's context length,
    which request validation reads."""
    from sglang.srt.entrypoints.openai import serving_chat

    recipe_serving.serving_settings(monkeypatch)
    monkeypatch.setattr(serving_chat, "get_model", lambda: SimpleNamespace(revision=None,
                                                                           context_length=CONTEXT_LEN))


def serving(cls: type, engine: Any) -> Any:
    """`cls` (OpenAIServingChat or pdfleet's guarded subclass) over `engine`, with SGLang's own template manager
    (no chat template loaded: the DeepSeek encoders render the prompt)."""
    from sglang.srt.parser.template_manager import TemplateManager

    return cls(engine, TemplateManager())


def app(handler: Any) -> Any:
    from fastapi import FastAPI, Request
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, ModelCard, ModelList
    from sglang.srt.utils.json_response import model_json_response

    api = FastAPI()
    manager = handler.tokenizer_manager

    async def chat_completions(request: ChatCompletionRequest, raw_request: Request) -> Any:
        return model_json_response(await handler.handle_request(request, raw_request))

    # FastAPI reads a route's parameters from its annotations, which this module's `from __future__ import
    # annotations` leaves as names it would look up in the module, where these lazily imported classes are not.
    chat_completions.__annotations__.update(request=ChatCompletionRequest, raw_request=Request)
    api.post("/v1/chat/completions")(chat_completions)

    @api.get("/v1/models")
    async def models() -> Any:
        name = manager.served_model_name
        return ModelList(data=[ModelCard(id=name, root=name, max_model_len=manager.model_config.context_len)])

    return api


def _answering(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def served(handler: Any) -> Iterator[str]:
    """`handler` over HTTP on 127.0.0.1 until the block ends; yields the server's URL once its port answers."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app(handler), lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"chat-http-{port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_S
        while not _answering(port):
            assert thread.is_alive(), "the chat server thread ended before it answered"
            assert time.monotonic() < deadline, f"127.0.0.1:{port} did not answer within {START_S:.0f} s"
            time.sleep(0.02)  # polling the condition, not waiting it out
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(START_S)
        sock.close()
