"""The kopf versions the operator's fixes to kopf's internals were written for, and the check that refuses any other.

The operator reaches into kopf's private modules: it wraps three of kopf's functions (kopf_fixes.py) and reads
kopf's registry and insights the way kopf's own revision of what it watches does (kopf_watch.py). Those two and this
module are the fence: no other module of pdfleet names kopf's private modules (.importlinter's kopf-fence contract
for imports, tests/unit/test_kopf_fence.py for imports, attribute access and dotted names), and every private kopf
module the fence imports holds a target fingerprinted here. Private code
changes without notice between releases, and a fix applied to code it was not written for is how a fix becomes a
bug, so `pdfleet-operator` starts only on a kopf this table names, and only if each kopf function the fixes
depend on is still the one they were written against: its fingerprint (a hash of its signature and source, the
same the runtime takes of SGLang's functions before patching them, runtime/patches/targets.py) must match. The
fingerprints also catch a kopf that reports a supported version but carries other code (a distribution's patch).

To support another kopf: install it, run `python -m pdfleet.operator.kopf_support` (it prints each target's
fingerprint there), read the changes to any target whose fingerprint differs, check the fixes still hold
(tests/unit/test_kopf_fixes.py, test_kopf_watch.py), then add the version here and pin it in pyproject.toml.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Mapping

from pdfleet.runtime.patches.targets import TargetError, fingerprint, resolve

WATCHER = "kopf._core.reactor.queueing.watcher"  # wrapped by kopf_fixes: drops toggles, forgets a gone namespace
WORKER = "kopf._core.reactor.queueing.worker"  # wrapped by kopf_fixes: drops its object's toggle when it ends
TERMINATE = "kopf._core.reactor.orchestration.terminate_redundancies"  # wrapped: marks watches of a gone namespace
PROCESS = "kopf._core.reactor.processing.process_resource_event"  # kopf_fixes calls it with its own DELETED events
REVISE = "kopf._core.reactor.observation.revise_resources"  # kopf_watch.watched_selectors mirrors what it selects
# Not wrapped, but read or called by the fence as kopf's own code does; a change in their shape would break it.
ENSEMBLE = "kopf._core.reactor.orchestration.Ensemble"  # kopf_fixes._terminator reads its watcher_tasks
ENSEMBLE_KEY = "kopf._core.reactor.orchestration.EnsembleKey"  # ... whose keys' namespace it compares
DROP_TOGGLE = "kopf._cogs.aiokits.aiotoggles.ToggleSet.drop_toggle"  # kopf_fixes drops the indexing toggles with it
INSIGHTS = "kopf._cogs.structs.references.Insights"  # kopf_watch reads ready_resources and watched_resources
REGISTRY = "kopf._core.intents.registries.OperatorRegistry.__init__"  # kopf_watch reads the sub-registries it makes

# kopf version -> dotted target -> fingerprint. The one place that says which kopf the operator runs on.
SUPPORTED: Mapping[str, Mapping[str, str]] = {
    "1.45.2": {
        WATCHER: "fc696c777bbe9dc4",
        WORKER: "081e0cad71f30cbc",
        TERMINATE: "f4c14048c59fcddf",
        PROCESS: "107259c4b276dc24",
        REVISE: "76e899758936e7eb",
        ENSEMBLE: "ff16d9d77eba26b4",
        ENSEMBLE_KEY: "fbf034a0b9de0f42",
        DROP_TOGGLE: "271af9e43c5cba09",
        INSIGHTS: "9436031112b63964",
        REGISTRY: "7d255a5303ad444b",
    },
}
TARGETS = (WATCHER, WORKER, TERMINATE, PROCESS, REVISE, ENSEMBLE, ENSEMBLE_KEY, DROP_TOGGLE, INSIGHTS, REGISTRY)


class UnsupportedKopf(RuntimeError):
    """The installed kopf is not one the operator's fixes were written for; the message says what to do."""


def installed_version() -> str | None:
    """The installed kopf's version, from its distribution's metadata (None: kopf is not installed)."""
    try:
        return importlib.metadata.version("kopf")
    except importlib.metadata.PackageNotFoundError:
        return None


def _supported() -> str:
    return ", ".join(sorted(SUPPORTED))


def _pin() -> str:
    return f"kopf=={max(SUPPORTED, key=lambda v: tuple(int(p) for p in v.split('.') if p.isdigit()))}"


def problem() -> str | None:
    """Why the operator must not start on the installed kopf (None: it may). Looks at the version first, then at
    the fingerprint of every kopf function the fixes depend on; imports kopf's private modules only for a version
    the table names."""
    version = installed_version()
    remedy = (f"Install {_pin()} (`pip install '{_pin()}'`), or check the fixes against kopf {version} and add "
              f"it to SUPPORTED in operator/kopf_support.py (its docstring says how).")
    if version is None:
        return f"kopf is not installed; the operator was written for kopf {_supported()}. {remedy}"
    expected = SUPPORTED.get(version)
    if expected is None:
        return (f"kopf {version} is installed, but the operator's fixes to kopf's internals (operator/kopf_fixes.py, "
                f"operator/kopf_watch.py) were written for kopf {_supported()}. {remedy}")
    changed = []
    for dotted, want in expected.items():
        try:
            got = fingerprint(resolve(dotted).function)
        except TargetError as e:
            changed.append(str(e))
            continue
        if got != want:
            changed.append(f"{dotted} (fingerprint {got}, expected {want})")
    if changed:
        return (f"kopf {version} is installed, but its code is not the kopf {version} the operator's fixes were "
                f"written for: {'; '.join(changed)}. {remedy}")
    return None


def require() -> None:
    """Raises UnsupportedKopf unless the installed kopf is one the fixes were written for."""
    why = problem()
    if why is not None:
        raise UnsupportedKopf(why)


def main() -> int:
    """Prints the installed kopf's version and each target's fingerprint, for adding a version to SUPPORTED."""
    print(f"kopf {installed_version()}")
    for dotted in TARGETS:
        try:
            print(f"    {dotted}: {fingerprint(resolve(dotted).function)!r},")
        except TargetError as e:
            print(f"    {dotted}: {e}")
    why = problem()
    print(why or "supported")
    return 0 if why is None else 1


if __name__ == "__main__":
    sys.exit(main())
