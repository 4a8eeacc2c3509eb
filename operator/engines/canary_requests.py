"""The tool-call canary's I/O: its requests, sent through the real `openai` client, concurrently, to a base URL
(a router or one engine: `run`, what `pdfleet canary` calls), or to a prefill and a decode engine together as the
router pairs them in PD (`run_pd`, what the toolCallCanary rollout gate calls). What to send and what the answers
mean is `planning.rollout.toolcall_canary`. The cut check's two probes wait for the reference's answer (their max_tokens
is read from it) while the rest of the load is in flight, so a run takes about one request longer.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import httpx
import openai

from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.planning.rollout import toolcall_canary
from pdfleet.operator.planning.rollout.toolcall_canary import (
    DEFAULT_CONCURRENCY,
    DEFAULT_REQUESTS,
    Answer,
    Probe,
    Report,
    ToolCall,
)

DEFAULT_MAX_TOKENS = 32


class Unreachable(Exception):
    """The URL answers no OpenAI-compatible API: nothing to judge."""


async def served_model(client: openai.AsyncOpenAI) -> str:
    """The first model the server lists; raises Unreachable when it lists none or does not answer."""
    try:
        models = await client.models.list()
    except openai.APIError as e:
        raise Unreachable(f"{client.base_url}models: {_describe(e)}") from None
    if not models.data:
        raise Unreachable(f"{client.base_url}models lists no model; pass --model")
    return str(models.data[0].id)


def _describe(error: Exception) -> str:
    if isinstance(error, openai.APIStatusError):
        return f"HTTP {error.status_code} {type(error).__name__}"
    if isinstance(error, openai.APITimeoutError | httpx.TimeoutException):
        return "timed out"
    if isinstance(error, openai.APIConnectionError):
        cause = error.__cause__
        return f"connection failed ({type(cause).__name__ if cause else 'no answer'})"
    return f"{type(error).__name__}: {error}"


async def _streamed(chunks: AsyncIterator[Any]) -> Answer:
    content: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    finish: str | None = None
    tokens: int | None = None
    async for chunk in chunks:
        if chunk.usage is not None:  # the last chunk, asked for with stream_options
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                content.append(delta.content)
            for call in delta.tool_calls or ():
                fn = call.function
                if fn is not None and fn.name:
                    names[call.index] = names.get(call.index, "") + fn.name
                if fn is not None and fn.arguments:
                    arguments.setdefault(call.index, []).append(fn.arguments)
            finish = choice.finish_reason or finish
    calls = tuple(ToolCall(names.get(i, ""), "".join(arguments.get(i, ()))) for i in sorted(names | arguments))
    return Answer("".join(content), calls, finish, completion_tokens=tokens)


async def ask(client: openai.AsyncOpenAI, probe: Probe, *, model: str, max_tokens: int,
              extra_body: Mapping[str, Any] | None = None) -> Answer:
    """One probe's answer; any failure is an Answer with its error. `extra_body`: fields the `openai` client puts
    at the top level of the JSON body (PD's bootstrap fields)."""
    kwargs = toolcall_canary.body(probe, model=model, max_tokens=max_tokens)
    if extra_body:
        kwargs["extra_body"] = dict(extra_body)
    try:
        if probe.stream:
            stream = await client.chat.completions.create(**kwargs)
            async with stream:
                return await _streamed(stream)
        completion = await client.chat.completions.create(**kwargs)
    except (openai.APIError, httpx.HTTPError) as e:  # httpx's own: a stream that breaks off while it is read
        return Answer(error=_describe(e))
    if not completion.choices:
        return Answer(error="an answer without choices")
    choice = completion.choices[0]
    calls = tuple(ToolCall(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()
                  if c.type == "function")
    tokens = completion.usage.completion_tokens if completion.usage is not None else None
    return Answer(choice.message.content or "", calls, choice.finish_reason, completion_tokens=tokens)


async def _judged(probes: list[Probe], one: Callable[[Probe], Awaitable[Answer]], *, concurrency: int,
                  parser: str | None, model: str) -> Report:
    """Every probe asked through `one`, at most `concurrency` at a time, and the answers judged; after the
    reference's answer (if the plan has one), the cut probes it allows."""
    gate = asyncio.Semaphore(concurrency)

    async def bounded(probe: Probe) -> tuple[Probe, Answer]:
        async with gate:
            return probe, await one(probe)

    async def cut_check(reference: Probe) -> tuple[list[tuple[Probe, Answer]], str | None]:
        first = await bounded(reference)
        cuts, not_sent = toolcall_canary.cuts(first[1], index=len(probes))
        return [first, *await asyncio.gather(*(bounded(p) for p in cuts))], not_sent

    started = time.monotonic()
    reference = next((p for p in probes if p.reference), None)
    load = asyncio.gather(*(bounded(p) for p in probes if p is not reference))
    if reference is None:  # plain requests only
        results, (checked, not_sent) = await load, ([], None)
    else:
        results, (checked, not_sent) = await asyncio.gather(load, cut_check(reference))
    found = toolcall_canary.report([*results, *checked], parser=parser, duration_s=time.monotonic() - started,
                        cut_not_sent=not_sent)
    found.model = model
    return found


async def run(url: str, *, requests: int = DEFAULT_REQUESTS, concurrency: int = DEFAULT_CONCURRENCY,
              model: str | None = None, timeout_s: float = 60.0, parser: str | None = None,
              max_tokens: int = DEFAULT_MAX_TOKENS) -> Report:
    """Sends the canary's `requests` to `url`, at most `concurrency` at a time, and judges the answers.

    Raises Unreachable when the server cannot be asked at all (its model list fails). A person runs this against a
    URL they gave, so proxies from the environment apply (`trust_env`), unlike the operator's own requests."""
    engines = EngineClient(trust_env=True)
    try:
        client = engines.openai(url, timeout=timeout_s)
        listed = await served_model(client)  # also proves the URL answers before any verdict is given
        chosen = model or listed
        return await _judged(toolcall_canary.plan(requests),
                             lambda p: ask(client, p, model=chosen, max_tokens=max_tokens),
                             concurrency=concurrency, parser=parser, model=chosen)
    finally:
        await engines.close()


async def run_pd(engines: EngineClient, prefill_url: str, decode_url: str, *, bootstrap_host: str,
                 bootstrap_port: int, model: str, requests: int, concurrency: int, timeout_s: float, parser: str | None,
                 max_tokens: int = DEFAULT_MAX_TOKENS, plain: bool = False) -> Report:
    """The canary as sglang-router sends requests in PD mode: each probe to the prefill engine and to the decode
    engine at once, the same body with the same bootstrap fields (the prefill engine's host and bootstrap port, a
    fresh random room), and the decode engine's answer judged (the prefill engine's is drained: the router
    discards it too), through the operator's client `engines`. `plain`: plain chat requests only (a bake's probes:
    traffic to judge the pair on, not tool calls).

    Raises Unreachable when the decode engine's model list fails."""
    prefill, decode = engines.openai(prefill_url, timeout=timeout_s), engines.openai(decode_url, timeout=timeout_s)
    await served_model(decode)

    async def paired(probe: Probe) -> Answer:
        boot = {"bootstrap_host": bootstrap_host, "bootstrap_port": bootstrap_port,
                "bootstrap_room": random.getrandbits(63)}
        first, answer = await asyncio.gather(
            ask(prefill, probe, model=model, max_tokens=max_tokens, extra_body=boot),
            ask(decode, probe, model=model, max_tokens=max_tokens, extra_body=boot))
        if first.error is not None and answer.error is None:
            return Answer(error=f"prefill: {first.error}")
        return answer

    probes = toolcall_canary.plain(requests) if plain else toolcall_canary.plan(requests)
    return await _judged(probes, paired, concurrency=concurrency, parser=parser, model=model)
