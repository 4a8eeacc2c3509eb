"""Verify and install the instrumentation's seams: all of them, or none.

The same check as every catalogue patch (`patches.targets`: resolve the dotted name, fingerprint the function,
refuse on any difference), with one addition: a seam may already carry a catalogue patch (say
`kv-poll-lockstep` replacing a KV poll). The instrumentation then wraps that patch, after checking that
the SGLang function underneath it is still the one both were written for; `engine_setup` applies the
catalogue patches first for this reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pdfleet.runtime.patches import base, targets

ID = "rank-instrumentation"
IMPLEMENTATION = "pdfleet.runtime.instrument.rank_seams"


def install(sglang_version: str, implementation: base.Implementation | None = None) -> base.Applied:
    """Installs every seam of `implementation` (default: `rank_seams`), or raises `base.PatchError` naming
    every seam that is missing or changed, having installed none."""
    impl = implementation if implementation is not None else importlib.import_module(IMPLEMENTATION)
    fingerprints = impl.FINGERPRINTS.get(sglang_version)
    if fingerprints is None:
        raise base.PatchError(f"{ID} was not checked against SGLang {sglang_version} "
                              f"(checked: {', '.join(sorted(impl.FINGERPRINTS)) or 'none'})")
    found: dict[str, targets.Target] = {}
    problems = []
    for dotted, expected in fingerprints.items():
        try:
            found[dotted] = _verify(dotted, expected)
        except targets.TargetError as e:
            problems.append(str(e))
    if problems:
        raise base.PatchError(f"{ID}: " + "; ".join(problems))
    originals = {dotted: t.function for dotted, t in found.items()}
    for dotted, new in impl.replacements(originals).items():
        found[dotted].replace(base.mark(new, ID, originals[dotted]))
    return base.Applied(id=ID, targets=tuple(found))


def _verify(dotted: str, expected: str) -> targets.Target:
    target = targets.resolve(dotted)
    if getattr(target.function, "__pdfleet_patch__", None) is None:
        return targets.verify(dotted, expected)
    chain = _patch_chain(target.function)
    if ID in chain:
        raise targets.TargetError(f"{dotted} is already instrumented")
    actual = targets.fingerprint(_unpatched(target.function))
    if actual != expected:
        raise targets.TargetError(
            f"{dotted} (under patch {', '.join(chain)}) is not the function this instrumentation was written for "
            f"(fingerprint {actual}, expected {expected})")
    return target


def _patch_chain(function: Callable[..., Any]) -> list[str]:
    chain = []
    while (pid := getattr(function, "__pdfleet_patch__", None)) is not None:
        chain.append(pid)
        function = function.__wrapped_original__  # type: ignore[attr-defined]
    return chain


def _unpatched(function: Callable[..., Any]) -> Callable[..., Any]:
    """The SGLang function under any pdfleet patches (`base.mark` keeps each one's original)."""
    while getattr(function, "__pdfleet_patch__", None) is not None:
        function = function.__wrapped_original__  # type: ignore[attr-defined]
    return function
