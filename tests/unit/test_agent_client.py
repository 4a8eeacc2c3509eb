"""The operator's agent client against a real agent: a report, or None for every way an agent can fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.operator.engines import agents
from pdfleet.operator.render.engine_group import AGENT_PORT
from pdfleet.runtime.health import agent, attach, phases
from tests.support.operator_process import free_port


def pod(name: str = "g-0", ip: str | None = "127.1.0.2") -> dict:
    return {"metadata": {"name": name}, "status": {"podIP": ip} if ip else {}}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[int]:
    ledger = tmp_path / "ledger"
    w = attach.attach_rank(slot=0, rank=0, slots=1, path=ledger, stack_signal=None)
    w.set_loop(phases.LoopName.EVENT_LOOP_NORMAL)
    w.begin(phases.Phase.FORWARD)
    with agent.Agent(ledger, host="127.0.0.1", port=0) as a:
        yield a.port
    w.close()


def test_the_default_address_is_the_pods_ip_and_the_agent_port_and_nothing_else() -> None:
    assert agents.pod_ip(pod(ip="127.1.0.2")) == ("127.1.0.2", AGENT_PORT)
    assert agents.pod_ip(pod(ip=None)) is None
    assert agents.pod_ip(pod(ip="evil.example.com")) is None


async def test_a_live_agent_answers_with_its_ranks(served: int) -> None:
    client = agents.AgentClient(addressing=lambda _: ("127.0.0.1", served))
    try:
        answers = await client.fetch_all([pod("a"), pod("b")])
    finally:
        await client.close()

    assert set(answers) == {"a", "b"}
    assert [e.record.phase for e in answers["a"].ranks] == [phases.Phase.FORWARD]


async def test_a_silent_or_unaddressable_pod_reads_as_no_answer() -> None:
    port = free_port()  # nothing listens there
    client = agents.AgentClient(addressing=lambda p: ("127.0.0.1", port) if p["status"] else None, timeout=0.5)
    try:
        answers = await client.fetch_all([pod("silent"), pod("no-ip", ip=None)])
    finally:
        await client.close()

    assert answers == {"silent": None, "no-ip": None}
