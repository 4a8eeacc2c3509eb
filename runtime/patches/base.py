"""What a patch implementation provides, and how the launcher applies a set of them: all or nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from pdfleet.runtime.patches import catalogue
from pdfleet.runtime.patches.targets import Target, TargetError, verify


class PatchError(Exception):
    """A patch that cannot be applied; the message says which and why, for the person starting the engine."""


class Implementation(Protocol):
    """A patch module: the fingerprints of its targets per SGLang version, and the replacements."""

    FINGERPRINTS: Mapping[str, Mapping[str, str]]  # sglang version -> dotted target -> fingerprint

    def replacements(self, originals: Mapping[str, Callable[..., Any]]) -> Mapping[str, Callable[..., Any]]:
        """dotted target -> the function to install there, given the originals."""
        ...


@dataclasses.dataclass(frozen=True)
class Applied:
    id: str
    targets: tuple[str, ...]


def mark(function: Callable[..., Any], patch_id: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """Tags a replacement so a second application is refused and the original stays reachable."""
    function.__pdfleet_patch__ = patch_id  # type: ignore[attr-defined]
    function.__wrapped_original__ = original  # type: ignore[attr-defined]
    return function


def check(patch_ids: Iterable[str], sglang_version: str) -> list[catalogue.Patch]:
    """The catalogue entries of `patch_ids`, or PatchError naming every id that is unknown or does not
    apply to `sglang_version`."""
    problems, entries = [], []
    for pid in patch_ids:
        entry = catalogue.BY_ID.get(pid)
        if entry is None:
            problems.append(f"unknown patch {pid!r} (known: {', '.join(catalogue.IDS)})")
        elif pid in catalogue.UNAVAILABLE:
            problems.append(f"patch {pid} is not implemented by pdfleet yet: {catalogue.UNAVAILABLE[pid]}")
        elif entry.fixed_in and catalogue.version_key(sglang_version) >= catalogue.version_key(entry.fixed_in):
            problems.append(f"patch {pid} is fixed upstream in SGLang {entry.fixed_in}; "
                            f"this engine runs {sglang_version} and does not need it")
        elif sglang_version not in entry.applies_to:
            problems.append(f"patch {pid} applies to SGLang {entry.applies_to}, not {sglang_version}")
        else:
            entries.append(entry)
    if problems:
        raise PatchError("; ".join(problems))
    return entries


def apply(patch_ids: Iterable[str], sglang_version: str,
          implementations: Mapping[str, Implementation]) -> list[Applied]:
    """Verifies every target of every patch first, then installs them all; installs nothing on any problem."""
    entries = check(patch_ids, sglang_version)
    planned: list[tuple[catalogue.Patch, Implementation, dict[str, Target]]] = []
    problems = []
    for entry in entries:
        impl = implementations.get(entry.id)
        if impl is None:
            problems.append(f"patch {entry.id} has no implementation in this runtime")
            continue
        fingerprints = impl.FINGERPRINTS.get(sglang_version)
        if fingerprints is None:
            problems.append(f"patch {entry.id} was not checked against SGLang {sglang_version} "
                            f"(checked: {', '.join(sorted(impl.FINGERPRINTS)) or 'none'})")
            continue
        targets = {}
        for dotted in entry.targets:
            try:
                targets[dotted] = verify(dotted, fingerprints[dotted])
            except (TargetError, KeyError) as e:
                problems.append(f"patch {entry.id}: {e if isinstance(e, TargetError) else f'no fingerprint for {e}'}")
        planned.append((entry, impl, targets))
    if problems:
        raise PatchError("; ".join(problems))
    applied = []
    for entry, impl, targets in planned:
        originals = {dotted: t.function for dotted, t in targets.items()}
        for dotted, new in impl.replacements(originals).items():
            targets[dotted].replace(mark(new, entry.id, originals[dotted]))
        applied.append(Applied(id=entry.id, targets=tuple(targets)))
    return applied
