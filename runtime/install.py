"""`python -m pdfleet.runtime.install DEST` (`pdfleet-install-runtime DEST`): put pdfleet's runtime where an
engine container can import it.

Engine pods run the user's SGLang image unchanged; an init container copies the runtime into a volume that
the engine container mounts at DEST and puts `DEST/lib` on PYTHONPATH. The copy is the `pdfleet.runtime`
package under `DEST/lib/pdfleet/runtime/` and the `pdfleet.kernels` package beside it (no operator code), with
no `DEST/lib/pdfleet/__init__.py`: `pdfleet` stays a namespace package, so it never hides (or is hidden by) a
pdfleet installed in the image itself. Everything the runtime imports at module level is the standard
library, so it runs on whatever Python the SGLang image has; SGLang is imported only when it is there to patch,
and the kernels (torch and Triton, which every SGLang image has) only by the bf16-index-keys patch as it installs.

The copy is written beside the target and renamed into place, so a restarted init container never leaves a
half-copied runtime behind. Byte code is not copied: the engine's Python compiles its own.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import pdfleet.runtime


def _package_dir(name: str) -> Path | None:
    """Where package `name` lives, found without importing it (importing pdfleet.kernels needs torch)."""
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]).resolve() if locations else None


PACKAGE = Path(pdfleet.runtime.__file__).resolve().parent
KERNELS = _package_dir("pdfleet.kernels")
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


REQUIRED = ("launcher.py", "bootstrap/sitecustomize.py")  # without sitecustomize, spawned ranks run unpatched


class InstallError(Exception):
    """The runtime to copy is incomplete (a wheel built without its non-package files)."""


def install(dest: Path, *, source: Path = PACKAGE, kernels: Path | None = KERNELS) -> Path:
    """Copy the runtime package under `dest/lib/pdfleet/runtime` and the kernels beside it; returns the runtime's
    directory."""
    missing = [name for name in REQUIRED if not (source / name).is_file()]
    if missing:
        raise InstallError(f"{source} lacks {', '.join(missing)}: this pdfleet was installed without them")
    if kernels is None or not (kernels / "__init__.py").is_file():
        raise InstallError(f"no pdfleet.kernels package to copy ({kernels}): this pdfleet was installed without it")
    namespace = dest / "lib" / "pdfleet"
    namespace.mkdir(parents=True, exist_ok=True)
    _replace(namespace, "kernels", kernels)
    return _replace(namespace, "runtime", source)


def _replace(namespace: Path, name: str, source: Path) -> Path:
    """`namespace/name` becomes a copy of `source`, written beside it and renamed into place."""
    target = namespace / name
    staging = namespace / f".{name}.new"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=_SKIP)
    old = namespace / f".{name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pdfleet-install-runtime", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", type=Path, help="the volume the engine container mounts (PYTHONPATH=DEST/lib)")
    options = parser.parse_args(argv)
    try:
        target = install(options.dest)
    except InstallError as e:
        print(f"pdfleet-install-runtime: {e}", file=sys.stderr)
        return 1
    print(f"pdfleet-install-runtime: runtime installed in {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
