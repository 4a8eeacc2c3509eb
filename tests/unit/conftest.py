"""Fixtures shared by the rank-health agent tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdfleet.runtime.health import agent


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
