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
    found = []
    for prefix, folder in COMPONENTS.items():
        found.append(prefix)  # `operator/` itself has no __init__.py: see the module docstring
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder).parts
            if rel:
                found.append(".".join((prefix, *rel)))
    return found


setup(packages=packages(), package_dir=COMPONENTS)
