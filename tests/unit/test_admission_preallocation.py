"""admission-consensus agrees SGLang's real `DecodePreallocQueue.pop_preallocated` across a decode group.

Reproduced on a real gloo group (tests/repro/preallocation.py) with SGLang 0.5.23's own `pop_preallocated`, its
token budget, request-slot and metadata checks, `_pre_alloc` into a real `TokenToKVPoolAllocator` and
`ReqToTokenPool` on the CPU, and `DecodeTransferQueue.extend`: every rank's prealloc queue holds the same three
requests whose handshakes completed; the last rank's pool has room for two. Unpatched it moves two to its transfer
queue while its peers move three (the transfer queues, and so the KV polls over them, differ). Patched, every
rank agrees the smallest free capacity first and moves the same two, keeping its own surplus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdfleet.runtime.health import phases
from pdfleet.runtime.patches.impl import admission_consensus as ac
from tests.repro import group, preallocation
from tests.repro.scenario import Scenario
from tests.support import requires

ALL = ["req-0", "req-1", "req-2"]
TWO = ["req-0", "req-1"]
HANDSHAKE_POLL = phases.Phase.PREALLOC_HANDSHAKE_POLL.label
AGREEMENT = phases.Phase.ADMISSION_AGREEMENT.label


def _run(tmp_path: Path, world: int, patches: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each rank's result of one `pop_preallocated` on a fresh group of `world` ranks."""
    requires.installed("sglang")
    sc = Scenario(port=group.free_port(), ledger=str(tmp_path / "ledger"), workdir=str(tmp_path), patches=patches,
                  world=world, iterations=1, arrivals={}, local_aborts={})
    launcher = group.start(sc, module="tests.repro.preallocation")
    try:
        exit_status = launcher.wait(timeout=150)
    finally:
        group.kill(launcher)  # a rank stuck in the group must not outlive the test
    assert exit_status == 0, (tmp_path / "launcher.log").read_text(errors="replace")[-4000:]
    return [json.loads(sc.result_path(rank).read_text()) for rank in range(world)]


def _pages_as_sglang_wrote_them(result: dict[str, Any]) -> None:
    """What each moved request was sent is what SGLang's `_pre_alloc` took from the pool and wrote into its
    `req_to_token` row: the real preallocation ran, not a count."""
    for rid in result["moved"]:
        pages = result["sent_pages"][rid]
        assert len(pages) == preallocation.PROMPT and pages == result["req_to_token_rows"][rid]
    taken = [page for rid in result["moved"] for page in result["sent_pages"][rid]]
    assert len(set(taken)) == len(taken)


@pytest.mark.parametrize("world", [2, 3])
def test_unpatched_the_rank_with_less_memory_moves_fewer_requests_to_its_transfer_queue(
        tmp_path: Path, world: int) -> None:
    results = _run(tmp_path, world, ())
    tight = results[-1]
    assert tight["moved"] == TWO and tight["still_queued"] == ["req-2"] and tight["failed"] == []
    assert tight["free_tokens"] == preallocation.TIGHT_FREE - 2 * preallocation.PROMPT
    for peer in results[:-1]:
        assert peer["moved"] == ALL and peer["still_queued"] == [] and peer["failed"] == []
        assert peer["free_tokens"] == preallocation.FREE - 3 * preallocation.PROMPT
    for result in results:
        assert result["patched"] == {} and result["collectives_entered"] == [HANDSHAKE_POLL]
        _pages_as_sglang_wrote_them(result)


@pytest.mark.parametrize("world", [2, 3])
def test_patched_every_rank_moves_the_groups_smallest_admission_and_keeps_its_surplus(
        tmp_path: Path, world: int) -> None:
    results = _run(tmp_path, world, (ac.PATCH_ID,))
    for result in results:
        assert result["applied"] == [ac.PATCH_ID]
        assert result["patched"]["DecodePreallocQueue.pop_preallocated"] == ac.PATCH_ID
        assert result["moved"] == TWO and result["still_queued"] == ["req-2"] and result["failed"] == []
        # One agreement per call, before SGLang's own handshake poll inside it.
        assert result["collectives_entered"] == [AGREEMENT, HANDSHAKE_POLL]
        assert result["free_slots"] == preallocation.SLOTS - 2 and result["reader_is_sglangs"]
        _pages_as_sglang_wrote_them(result)
    spent = 2 * preallocation.PROMPT
    assert results[-1]["free_tokens"] == preallocation.TIGHT_FREE - spent
    # The roomier ranks spent the same and keep what they had beyond the smallest.
    assert [r["free_tokens"] for r in results[:-1]] == [preallocation.FREE - spent] * (world - 1)
