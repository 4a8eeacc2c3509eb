"""Fixtures shared by the rank-health agent tests and the desync reproduction tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdfleet.runtime.health import agent
from tests.repro import group
from tests.repro.scenario import Scenario, local_aborts_for


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger"


@pytest.fixture
def served(ledger_path: Path) -> Iterator[httpx.Client]:
    """An agent on an ephemeral loopback port serving `ledger_path`, and a client for it."""
    with (
        agent.Agent(ledger_path, host="127.0.0.1", port=0) as a,
        httpx.Client(base_url=f"http://127.0.0.1:{a.port}", timeout=30) as client,
    ):
        yield client


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[group.Launch]:
    """Starts reproduction runs (tests/repro); every process they started is killed at the end, whatever
    happened. A story without `local_aborts` gets the default abort story for its world size. `module`: the
    reproduction's launcher (tests/repro/decode_loop.py unless said)."""
    started: list[group.Launcher] = []

    def run(patches: tuple[str, ...], world: int = 4, module: str = "tests.repro.decode_loop",
            **story: Any) -> tuple[Scenario, group.Launcher]:
        story.setdefault("local_aborts", local_aborts_for(world))
        sc = Scenario(port=group.free_port(), ledger=str(tmp_path / "ledger"), workdir=str(tmp_path),
                      patches=patches, world=world, **story)
        started.append(group.start(sc, module=module))
        return sc, started[-1]

    try:
        yield run
    finally:
        for proc in started:
            group.kill(proc)
