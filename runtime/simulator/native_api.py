"""SGLang's native HTTP surface: /health, /generate, /server_info, /model_info, /v1/loads, /metrics, and the
requests pdfleet refuses on every engine (`refused`)."""

from __future__ import annotations

import json
import logging
import time
from http import HTTPStatus
from typing import Any

from aiohttp import web

from pdfleet.runtime import server_info_redaction
from pdfleet.runtime.simulator import info, refused, tokenizer
from pdfleet.runtime.simulator.faults import Fault
from pdfleet.runtime.simulator.scheduler import RequestError
from pdfleet.runtime.simulator.state import State, request_from, sse

log = logging.getLogger(__name__)

STATE = web.AppKey("state", State)


def _state(request: web.Request) -> State:
    return request.app[STATE]


async def health(request: web.Request) -> web.Response:
    """200 while serving, even with stuck ranks (SGLang's answers from its tokenizer process, which is fine);
    503 while starting and once SIGTERM arrived."""
    state = _state(request)
    return web.Response(status=200 if state.ready and not state.shutting_down else 503)


async def server_info(request: web.Request) -> web.Response:
    state = _state(request)
    resolved = dict(await state.resolved)
    if state.fault is Fault.WRONG_SERVER_ARGS:
        resolved["disable_overlap_schedule"] = not resolved.get("disable_overlap_schedule")
    body = {
        **resolved,
        **info.scheduler_info(state.timing, state.started),
        "startup_time": state.started,
        "internal_states": [{"last_gen_throughput": state.gen_throughput(), "avg_spec_accept_length": None}],
        "version": info.sglang_version(),
        "frontend": "python",
    }
    # As every pdfleet engine answers it: SGLang's API keys redacted (runtime/server_info_redaction.py).
    return web.json_response(server_info_redaction.redact(body), dumps=lambda o: json.dumps(o, default=str))


async def model_info(request: web.Request) -> web.Response:
    state = _state(request)
    return web.json_response(info.model_info(state.engine, await state.resolved))


async def loads(request: web.Request) -> web.Response:
    state = _state(request)
    include = request.query.get("include")
    sections = {s.strip() for s in include.split(",")} if include else None
    try:
        body = info.loads(state.engine, state.timing, dict(state.scheduler.queues), state.scheduler.used_tokens,
                          sections, state.gen_throughput())
    except ValueError as e:
        return web.json_response({"detail": str(e)}, status=400)
    return web.json_response(body)


async def metrics(request: web.Request) -> web.Response:
    state = _state(request)
    text = info.metrics(state.engine, state.timing, dict(state.scheduler.queues), dict(state.scheduler.totals),
                        dict(state.scheduler.streamed), state.scheduler.used_tokens, state.gen_throughput(),
                        (state.scheduler.ttft, state.scheduler.itl))
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


def _meta(rid: str, prompt_tokens: int, output: list[int], finished: bool, started: float) -> dict[str, Any]:
    return {
        "id": rid,
        "finish_reason": {"type": "length", "length": len(output)} if finished else None,
        "prompt_tokens": prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "completion_tokens": len(output),
        "cached_tokens": 0,
        "e2e_latency": time.monotonic() - started,
    }


async def generate(request: web.Request) -> web.StreamResponse:
    state = _state(request)
    started = time.monotonic()
    try:
        body = await request.json()
        text = body.get("text")
        if text is not None and not isinstance(text, str):
            raise RequestError(HTTPStatus.BAD_REQUEST, "the simulator serves one prompt per request")
        req = request_from(body, prompt_text=text,
                           max_new_tokens=(body.get("sampling_params") or {}).get("max_new_tokens"))
        state.admit()
    except RequestError as e:
        return web.json_response({"error": {"message": str(e)}}, status=e.status)
    except ValueError as e:
        return web.json_response({"error": {"message": f"invalid JSON body: {e}"}}, status=400)
    output: list[int] = []
    if not body.get("stream"):
        try:
            output = await state.scheduler.complete(req)
        except RequestError as e:
            if e.status == HTTPStatus.BAD_REQUEST:
                return web.json_response({"error": {"message": str(e)}}, status=e.status)
            return web.json_response({"detail": str(e)}, status=e.status)
        return web.json_response({"text": tokenizer.decode(output), "output_ids": output,
                                  "meta_info": _meta(req.rid, len(req.input_ids), output, True, started)})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        try:
            async for token in state.scheduler.generate(req):
                output.append(token)
                # Cumulative text and ids, as SGLang streams by default (no incremental streaming output).
                last = len(output) == req.max_new_tokens or state.engine.mode == "prefill"
                await response.write(sse({"text": tokenizer.decode(output), "output_ids": list(output),
                                           "meta_info": _meta(req.rid, len(req.input_ids), output, last, started)}))
        except RequestError as e:
            meta = _meta(req.rid, len(req.input_ids), output, False, started)
            meta["finish_reason"] = {"type": "abort", "message": str(e), "status_code": e.status}
            await response.write(sse({"text": tokenizer.decode(output), "output_ids": output, "meta_info": meta}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:  # the client went away mid-stream: nobody is left to tell
        log.info("client of %s went away mid-stream", req.rid)
    return response


def add_routes(app: web.Application, *, leader: bool, enable_metrics: bool) -> None:
    """A non-leader node of a multi-node group serves health only, as SGLang's dummy health server does."""
    for path in ("/health", "/health_generate", "/ping"):
        app.router.add_get(path, health)
    if not leader:
        return
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, server_info)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, model_info)
    app.router.add_get("/v1/loads", loads)
    app.router.add_post("/generate", generate)
    app.router.add_put("/generate", generate)
    refused.add_routes(app)
    if enable_metrics:
        app.router.add_get("/metrics", metrics)
