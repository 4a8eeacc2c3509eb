"""Patches are all or nothing: every target is found and fingerprinted before anything is replaced."""

from __future__ import annotations

import sys
import textwrap
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pdfleet.runtime.patches import base, catalogue, hooks, targets


@pytest.fixture
def fake_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A real module on disk, so its functions have source to fingerprint."""
    (tmp_path / "fake_engine.py").write_text(textwrap.dedent('''
        def poll(queue):
            return [1 for _ in queue]

        class Scheduler:
            def loop(self):
                return "overlap"
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fake_engine", None)
    import fake_engine

    yield fake_engine
    sys.modules.pop("fake_engine", None)


class Impl:
    """A patch implementation, as a module would provide it."""

    def __init__(self, fingerprints: Mapping[str, Mapping[str, str]]) -> None:
        self.FINGERPRINTS = fingerprints

    def replacements(self, originals: Mapping[str, Callable[..., Any]]) -> Mapping[str, Callable[..., Any]]:
        return {name: (lambda *a, **k: "patched") for name in originals}


@pytest.fixture
def two_patches(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = (
        catalogue.Patch(id="p-poll", summary="", applies_to=catalogue.VersionRange("1.0"),
                        targets=("fake_engine.poll",)),
        catalogue.Patch(id="p-loop", summary="", applies_to=catalogue.VersionRange("1.0", below="2.0"),
                        targets=("fake_engine.Scheduler.loop",)),
        catalogue.Patch(id="p-old", summary="", applies_to=catalogue.VersionRange("0.1"),
                        targets=("fake_engine.poll",), fixed_in="1.0"),
    )
    monkeypatch.setattr(catalogue, "BY_ID", {p.id: p for p in fake})
    monkeypatch.setattr(catalogue, "IDS", tuple(p.id for p in fake))


def test_a_target_resolves_through_modules_and_classes(fake_sglang: types.ModuleType) -> None:
    t = targets.resolve("fake_engine.Scheduler.loop")
    assert t.owner is fake_sglang.Scheduler
    assert t.attr == "loop"


def test_a_missing_target_is_named() -> None:
    with pytest.raises(targets.TargetError, match="has no Nope"):
        targets.resolve("pdfleet.runtime.patches.targets.Nope")


def test_patches_apply_when_every_fingerprint_matches(fake_sglang: types.ModuleType, two_patches: None) -> None:
    prints = {"fake_engine.poll": targets.fingerprint(fake_sglang.poll),
              "fake_engine.Scheduler.loop": targets.fingerprint(fake_sglang.Scheduler.loop)}
    impls = {"p-poll": Impl({"1.5": prints}), "p-loop": Impl({"1.5": prints})}
    applied = base.apply(["p-poll", "p-loop"], "1.5", impls)
    assert [a.id for a in applied] == ["p-poll", "p-loop"]
    assert fake_sglang.poll([1]) == "patched"
    assert fake_sglang.Scheduler().loop() == "patched"
    with pytest.raises(base.PatchError, match="already patched by p-poll"):
        base.apply(["p-poll"], "1.5", impls)


def test_a_changed_target_refuses_every_patch(fake_sglang: types.ModuleType, two_patches: None) -> None:
    prints = {"fake_engine.poll": targets.fingerprint(fake_sglang.poll),
              "fake_engine.Scheduler.loop": "0123456789abcdef"}  # as if SGLang had changed the loop
    impls = {"p-poll": Impl({"1.5": prints}), "p-loop": Impl({"1.5": prints})}
    with pytest.raises(base.PatchError, match=r"fake_engine\.Scheduler\.loop is not the function this patch"):
        base.apply(["p-poll", "p-loop"], "1.5", impls)
    assert fake_sglang.poll([1]) == [1], "nothing may be patched when any patch is refused"


@pytest.mark.parametrize(("ids", "version", "says"), [
    (["nope"], "1.5", "unknown patch 'nope'"),
    (["p-loop"], "2.1", "applies to SGLang >=1.0,<2.0, not 2.1"),
    (["p-old"], "1.2", "fixed upstream in SGLang 1.0"),
])
def test_unknown_and_inapplicable_patches_are_refused_with_a_reason(two_patches: None, ids: list[str],
                                                                    version: str, says: str) -> None:
    with pytest.raises(base.PatchError, match=says):
        base.check(ids, version)


def test_a_version_the_patch_was_never_checked_against_is_refused(fake_sglang: types.ModuleType,
                                                                  two_patches: None) -> None:
    with pytest.raises(base.PatchError, match=r"was not checked against SGLang 1\.7"):
        base.apply(["p-poll"], "1.7", {"p-poll": Impl({"1.5": {}})})


def test_an_import_hook_runs_after_the_module_is_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "late_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    hooks.after_import("late_module", lambda m: seen.append(m.VALUE))
    assert seen == []
    import late_module  # noqa: F401

    assert seen == [1]
    sys.modules.pop("late_module", None)
