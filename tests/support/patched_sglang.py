"""Installing catalogue patches into this test process's SGLang, and putting SGLang back afterwards."""

from __future__ import annotations

import inspect
from collections.abc import Iterable

import pytest

from pdfleet.runtime.patches import registry, targets
from tests.support import requires


def restore_after_test(monkeypatch: pytest.MonkeyPatch, patch_ids: Iterable[str]) -> None:
    """Re-setting each target of `patch_ids` to itself makes `monkeypatch` put it back after the test, patched
    by then or not."""
    requires.installed("sglang")
    ids = tuple(patch_ids)
    for impl in registry.implementations(ids).values():
        for dotted in impl.TARGETS:  # type: ignore[attr-defined]
            t = targets.resolve(dotted)
            monkeypatch.setattr(t.owner, t.attr, inspect.getattr_static(t.owner, t.attr))
