"""Evidence of a sick group, captured from its agents before the operator restarts it (docs/architecture.md).

`capture` asks every pod's agent, through the operator's one client (`client.EngineClient`), for its ranks' records
(`/ranks`) and, when asked, their Python stacks (`/ranks/stacks`), all at once and each bounded by a short
timeout; a pod that does not answer is noted, never waited for. `configmap` turns what came back into the
ConfigMap the planner named (`planning.health.restarts.EvidenceRequest`), small enough for the apiserver: stacks are
truncated first, with a note. Agents serve only rank records and stacks: nothing secret is asked for or kept.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.planning.health.restarts import EvidenceRequest

Body = dict[str, Any]

MAX_DATA = 900 * 1024  # bytes of ConfigMap data; the apiserver refuses objects over 1 MiB
STACK_TIMEOUT_S = 2.0  # what an agent may spend collecting stacks
UNREACHABLE = '{"unreachable": true}'
TRUNCATED = "\n... truncated by the pdfleet operator: the evidence must fit in one ConfigMap\n"


async def capture(agents: EngineClient, request: EvidenceRequest, pods: Sequence[Body], *,
                  timeout: float = 2.0) -> dict[str, str]:
    """ConfigMap data: `summary.txt`, then `<pod>.ranks.json` and `<pod>.stacks.json` for every pod asked."""

    async def one(pod: Body) -> tuple[str, Any, Any]:
        records = agents.agent_json(pod, timeout=timeout) if request.records else _none()
        stacks = agents.agent_json(pod, path=f"/stacks?timeout={STACK_TIMEOUT_S:g}",
                                   timeout=timeout + STACK_TIMEOUT_S) if request.stacks else _none()
        got = await asyncio.gather(records, stacks)
        return pod["metadata"]["name"], got[0], got[1]

    answers = await asyncio.gather(*(one(p) for p in pods))
    return data_of(request, answers)


async def _none() -> None:
    return None


def data_of(request: EvidenceRequest, answers: Sequence[tuple[str, Any, Any]]) -> dict[str, str]:
    """The ConfigMap data for what each pod answered (pod, records or None, stacks or None), within MAX_DATA."""
    silent = [name for name, records, stacks in answers
              if (request.records and records is None) or (request.stacks and stacks is None)]
    asked = [name for name, _, _ in answers]
    missing = sorted(set(request.pods) - set(asked))
    summary = "\n".join([
        f"group: {request.group}",
        f"verdict: {request.verdict}",
        f"evidence: {request.message}",
        f"pods asked: {', '.join(asked) or 'none'}",
        f"pods gone before capture: {', '.join(missing) or 'none'}",
        f"agents that did not answer: {', '.join(silent) or 'none'}",
    ]) + "\n"
    data = {"summary.txt": summary}
    records = {name: r for name, r, _ in answers if request.records}
    record_room = (MAX_DATA // 4) // max(1, len(records))  # records are a few KiB; a quarter is plenty
    for name, value in records.items():
        data[f"{name}.ranks.json"] = _fit(_dump(value) if value is not None else UNREACHABLE, record_room)
    stacks = {name: s for name, _, s in answers if request.stacks}
    room = (MAX_DATA - _size(data)) // max(1, len(stacks)) - 64  # 64: the key of each
    for name, value in stacks.items():
        data[f"{name}.stacks.json"] = _fit(_dump(value) if value is not None else UNREACHABLE, room)
    return data


def _fit(text: str, room: int) -> str:
    if len(text.encode()) <= room:
        return text
    return text.encode()[:max(0, room - len(TRUNCATED))].decode(errors="ignore") + TRUNCATED


def configmap(request: EvidenceRequest, data: Mapping[str, str]) -> Body:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": dict(request.metadata), "data": dict(data)}


def _dump(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True)


def _size(data: Mapping[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in data.items())
