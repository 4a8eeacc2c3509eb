"""The engine's shared state on the HTTP side, and the parsing of a request body into a `Request`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from pdfleet.runtime.simulator import tokenizer
from pdfleet.runtime.simulator.config import Engine, Timing
from pdfleet.runtime.simulator.faults import Fault
from pdfleet.runtime.simulator.ranks import Control
from pdfleet.runtime.simulator.scheduler import Request, RequestError, Scheduler

DEFAULT_MAX_NEW_TOKENS = 128
SHUTTING_DOWN = "The server is shutting down and admits no new requests."


@dataclasses.dataclass
class State:
    engine: Engine
    timing: Timing
    scheduler: Scheduler
    control: Control
    resolved: asyncio.Future[dict[str, Any]]
    started: float = dataclasses.field(default_factory=time.time)
    ready: bool = False  # false while "loading the model"
    shutting_down: bool = False
    plain_in_flight: int = 0  # chat requests without tools being served: a tool request is "batched" with them

    @property
    def fault(self) -> Fault:
        return Fault(self.control.fault.value)

    def admit(self) -> None:
        if self.shutting_down or not self.ready:
            raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, SHUTTING_DOWN if self.shutting_down else
                               "The server is starting.")

    def gen_throughput(self) -> float:
        """Tokens per second the decode steps made over the last seconds, measured."""
        return self.scheduler.gen_throughput()


def sse(obj: object) -> bytes:
    """One server-sent event, as SGLang writes them."""
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def request_from(body: Mapping[str, Any], *, prompt_text: str | None, max_new_tokens: Any) -> Request:
    """A `Request` from a JSON body: its prompt (text, or `input_ids`), length and PD bootstrap fields."""
    if prompt_text is not None:
        input_ids = tokenizer.encode(prompt_text)
    elif isinstance(body.get("input_ids"), list) and all(isinstance(t, int) for t in body["input_ids"]):
        input_ids = list(body["input_ids"])
    else:
        raise RequestError(HTTPStatus.BAD_REQUEST, "Either text or input_ids should be provided (one prompt: the "
                                                   "simulator does not batch in one request).")
    try:
        limit = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
        return Request(
            rid=str(body.get("rid") or uuid.uuid4().hex),
            input_ids=input_ids or [0],
            max_new_tokens=max(1, limit),
            bootstrap_host=body.get("bootstrap_host"),
            bootstrap_port=_int_or_none(body.get("bootstrap_port")),
            bootstrap_room=_int_or_none(body.get("bootstrap_room")),
            stream=bool(body.get("stream")),
        )
    except (TypeError, ValueError) as e:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid request: {e}") from None
