"""docs/desync-audit.md stays true for the pinned SGLang: every function it audits still has the fingerprint it
had when it was read, and the page names every function the list pins."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import rank_seams
from pdfleet.runtime.patches import targets
from pdfleet.runtime.patches.impl import (
    abort_consensus,
    admission_consensus,
    flush_consensus,
    health_check_consensus,
    kv_poll_lockstep,
    retraction_consensus,
)
from tests.support import desync_audit

AUDIT_PAGE = Path(__file__).resolve().parents[2] / "docs" / "desync-audit.md"


def stale(audited: Mapping[str, str]) -> list[str]:
    """One line per listed function that is gone from the installed SGLang or differs from its pin."""
    problems = []
    for dotted, expected in audited.items():
        try:
            actual = targets.fingerprint(targets.resolve(dotted).function)
        except targets.TargetError as e:
            problems.append(f"{dotted}: gone ({e})")
            continue
        if actual != expected:
            problems.append(f"{dotted}: fingerprint {actual}, audited as {expected}; re-audit it in "
                            f"docs/desync-audit.md and update tests/support/desync_audit.py")
    return problems


@pytest.mark.parametrize("dotted", sorted(desync_audit.AUDITED))
def test_each_audited_function_is_the_one_the_audit_read(dotted: str) -> None:
    assert stale({dotted: desync_audit.AUDITED[dotted]}) == []


def test_a_changed_or_missing_function_is_reported_by_name() -> None:
    changed = "sglang.srt.disaggregation.utils.all_reduce_flags"
    missing = "sglang.srt.disaggregation.decode.DecodeTransferQueue.no_such_method"
    problems = stale({changed: "0000000000000000", missing: "0000000000000000"})
    assert len(problems) == 2
    assert problems[0].startswith(f"{changed}: fingerprint {desync_audit.AUDITED[changed]}")
    assert problems[1].startswith(f"{missing}: gone")


def test_the_audit_page_names_every_listed_function() -> None:
    page = AUDIT_PAGE.read_text()
    assert [dotted for dotted in desync_audit.AUDITED if f"`{dotted}`" not in page] == []


def test_the_audit_is_pinned_to_the_release_the_desync_patches_were_checked_against() -> None:
    """Where a desync patch targets an audited function, both pins agree: the audit and the patch describe
    the same code."""
    for impl in (kv_poll_lockstep, abort_consensus, health_check_consensus, retraction_consensus,
                 admission_consensus, flush_consensus):
        pins = impl.FINGERPRINTS[desync_audit.SGLANG_VERSION]
        shared = set(pins) & set(desync_audit.AUDITED)
        assert shared, f"{impl.PATCH_ID} targets no audited function"
        assert {d: pins[d] for d in shared} == {d: desync_audit.AUDITED[d] for d in shared}


def test_every_caller_the_ledger_names_is_an_audited_function() -> None:
    assert [dotted for dotted in rank_seams.SITES if dotted not in desync_audit.AUDITED] == []


def test_the_audit_page_says_which_phase_each_audited_collective_is_recorded_under() -> None:
    page = AUDIT_PAGE.read_text()
    named = [p for p in phases.Phase if p.is_collective]
    # OTHER_COLLECTIVE is the catch-all for a collective outside the audit: no row of the page records under it.
    assert [p.label for p in named if f"`{p.label}` ({p.value})" not in page] == ["other_collective"]
