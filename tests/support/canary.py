"""Waiting until a simulated engine (or a router in front of simulated engines) answers tool requests as a
leak fault (or `truncated-call`) asks: the annotation is polled by the engine, so a test asks until the answer
shows it."""

from __future__ import annotations

import openai

from pdfleet.operator.planning.rollout import toolcall_canary as tc

LEAKS = {"leak-stripped-markers": "stripped-markers", "leak-parser-off": "parser-off",
         "leak-wrong-version-markers": "wrong-version-markers", "leak-malformed-call": "malformed-call"}


def tool_answer_leaks(url: str, model: str) -> bool:
    """Whether a tool request sent while a plain one streams (a mixed batch) comes back as text."""
    client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none", max_retries=0, timeout=10)
    with client.chat.completions.create(model=model, max_tokens=200, stream=True,
                                        messages=[{"role": "user", "content": "plain"}]) as plain:
        next(iter(plain))  # the plain request is being served
        msg = client.chat.completions.create(model=model, max_tokens=4, tools=tc.TOOLS,  # type: ignore[arg-type]
                                             messages=[{"role": "user", "content": "x"}]).choices[0].message
    return msg.tool_calls is None and bool(msg.content)


def cut_call_returned(url: str, model: str) -> bool:
    """Whether a tool request whose max_tokens ends inside its call gets the cut call back (`truncated-call`);
    a healthy engine returns no call."""
    client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none", max_retries=0, timeout=10)
    choice = client.chat.completions.create(model=model, max_tokens=1, tools=tc.TOOLS,  # type: ignore[arg-type]
                                            messages=[{"role": "user", "content": "x"}]).choices[0]
    return bool(choice.message.tool_calls)
