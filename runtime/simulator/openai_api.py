"""The OpenAI-compatible surface: /v1/models and /v1/chat/completions (streamed or not), in SGLang's shapes.

PD bootstrap fields (`bootstrap_host`, `bootstrap_port`, `bootstrap_room`) ride at the top level of the
JSON body, where the router puts them (and where the `openai` client's `extra_body` puts them). A request with
tools is answered with a tool call (`simulator/toolcalls.py`) written in `toolcalls.CALL_TOKENS` tokens, or fewer
when its max_tokens cuts it; the tokens still come from the scheduler, so it takes the time and KV a generation of
that length takes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from http import HTTPStatus
from typing import Any

from aiohttp import web

from pdfleet.runtime.simulator import tokenizer, toolcalls
from pdfleet.runtime.simulator.native_api import STATE
from pdfleet.runtime.simulator.scheduler import Request, RequestError
from pdfleet.runtime.simulator.state import State, request_from, sse

log = logging.getLogger(__name__)


def _error(status: int, message: str) -> dict[str, Any]:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return {"object": "error", "message": message, "type": kind, "param": None, "code": int(status)}


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    name = state.engine.served_model_name
    return web.json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": int(state.started), "owned_by": "sglang", "root": name,
         "parent": None, "max_model_len": state.timing.context_len}]})


def _chunk(req: Request, model: str, created: int, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {"id": req.rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                         "matched_stop": None}]}


def _usage(req: Request, completion: int) -> dict[str, Any]:
    prompt = len(req.input_ids)
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "reasoning_tokens": 0}


async def _tool_answer(state: State, body: dict[str, Any], max_tokens: int) -> toolcalls.Answer | None:
    """The model's tool call, for a tool request (None for a plain one)."""
    if not toolcalls.is_tool_request(body):
        return None
    parser = (await state.resolved).get("tool_call_parser")
    return toolcalls.answer(body, parser=parser, fault=state.fault, plain_alongside=state.plain_in_flight > 0,
                            max_tokens=max_tokens)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    plain = False
    try:
        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(HTTPStatus.BAD_REQUEST, "messages must be a non-empty list")
        if int(body.get("n") or 1) != 1:
            raise RequestError(HTTPStatus.BAD_REQUEST, "the simulator serves n=1 only")
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        req = request_from(body, prompt_text=tokenizer.chat_prompt(messages), max_new_tokens=limit)
        state.admit()
        plain = not toolcalls.is_tool_request(body)
        state.plain_in_flight += plain
        return await _serve(request, state, body, req)
    except RequestError as e:
        return web.json_response(_error(e.status, str(e)), status=e.status)
    except ValueError as e:
        return web.json_response(_error(400, f"invalid JSON body: {e}"), status=400)
    finally:
        state.plain_in_flight -= plain


async def _serve(request: web.Request, state: State, body: dict[str, Any], req: Request) -> web.StreamResponse:
    model = str(body.get("model") or state.engine.served_model_name)
    created = int(time.time())
    output: list[int] = []
    tool = await _tool_answer(state, body, req.max_new_tokens)
    if tool is not None:  # the model stops once its call is written
        req = dataclasses.replace(req, max_new_tokens=min(req.max_new_tokens, toolcalls.CALL_TOKENS))
    if not body.get("stream"):
        try:
            output = await state.scheduler.complete(req)
        except RequestError as e:
            return web.json_response(_error(e.status, str(e)), status=e.status)
        message = toolcalls.message(tool) if tool else {
            "role": "assistant", "content": tokenizer.decode(output), "reasoning_content": None, "tool_calls": None}
        return web.json_response({
            "id": req.rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": tool.finish_reason if tool else "length", "matched_stop": None}],
            "usage": _usage(req, len(output)), "metadata": {"weight_version": "default"},
        })
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        try:
            # A tool answer's deltas go out one a token; what the tokens did not carry goes at the end.
            scripted = toolcalls.stream_deltas(tool) if tool else []
            async for token in state.scheduler.generate(req):
                delta: dict[str, Any] = scripted.pop(0) if scripted else (
                    {} if tool else {"content": tokenizer.decode_token(token)})
                if not output:
                    delta = {"role": "assistant", **delta}
                output.append(token)
                if delta:
                    await response.write(sse(_chunk(req, model, created, delta, None)))
            for delta in scripted:
                await response.write(sse(_chunk(req, model, created, delta, None)))
            await response.write(sse(_chunk(req, model, created, {}, tool.finish_reason if tool else "length")))
            if include_usage:
                await response.write(sse({"id": req.rid, "object": "chat.completion.chunk", "created": created,
                                           "model": model, "choices": [], "usage": _usage(req, len(output))}))
        except RequestError as e:
            await response.write(sse({"error": _error(e.status, str(e))}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:  # the client went away mid-stream: nobody is left to tell
        log.info("client of %s went away mid-stream", req.rid)
    return response


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
