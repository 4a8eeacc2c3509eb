"""Maps the top-level component folders into the `pdfleet` namespace.

`operator/` must never become an importable top-level package (it would shadow the standard library's
`operator`), so each folder is installed as `pdfleet.<folder>`, and every package below it is found here
instead of being listed by hand. `operator/` itself has no `__init__.py` on purpose: a Python started in the
repository root puts the root on sys.path, and a regular package named `operator` there would win over the
standard library (even pip fails then); a folder without `__init__.py` never does. `pdfleet.operator` is
therefore a namespace package.
"""

from pathlib import Path

from setuptools import setup

COMPONENTS = {"pdfleet.operator": "operator", "pdfleet.runtime": "runtime", "pdfleet.kernels": "kernels",
              "pdfleet.podrunner": "podrunner"}
ROOT = Path(__file__).resolve().parent


def packages() -> list[str]:
    """Every folder holding Python files, with or without __init__.py: `operator/` itself (see above), and
    runtime/bootstrap, whose sitecustomize.py the engine's ranks import from PYTHONPATH (runtime/launcher.py).
    Left out, setuptools would still ship such a folder but warn that it is an unlisted package."""
    found = set()
    for prefix, folder in COMPONENTS.items():
        for module in (ROOT / folder).rglob("*.py"):
            found.add(".".join((prefix, *module.parent.relative_to(ROOT / folder).parts)))
    return sorted(found)


setup(packages=packages(), package_dir=COMPONENTS)
