"""kopf's private modules (kopf._core, kopf._cogs, kopf._kits) are reached only from the fence: operator/kopf_fixes.py,
kopf_watch.py and kopf_support.py, whose guard refuses a kopf they were not written for (test_kopf_support.py).

.importlinter's kopf-fence contract holds the imports; it cannot see `kopf._core.x` reached through `import kopf`,
`getattr(kopf, "_core")`, or a dotted name handed to importlib, so this walks the syntax tree of every module that
ships (operator/, runtime/, kernels/, podrunner/). The tests and benchmarks drive kopf's internals on purpose and are
not fenced. Every private kopf module the fence imports must also hold a target the guard fingerprints, so that a
new reach into kopf comes with its check."""

from __future__ import annotations

import ast
import configparser
import re
from collections.abc import Iterator
from pathlib import Path

from pdfleet.operator import kopf_support

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("operator", "runtime", "kernels", "podrunner")
FENCE = frozenset({"operator/kopf_fixes.py", "operator/kopf_watch.py", "operator/kopf_support.py"})
PRIVATE = re.compile(r"kopf\._\w+(\.\w+)*")  # a dotted name into kopf's private modules, as importlib takes it


def _private(module: str) -> bool:
    return module.startswith("kopf._")


def reaches(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for each way `source` reaches into kopf's private modules."""
    tree = ast.parse(source)
    names = {"kopf"}  # what kopf itself is bound to here (`import kopf as k`)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name == "kopf" and a.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, f"import {a.name}") for a in node.names if _private(a.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _private(node.module):
                yield node.lineno, f"from {node.module} import"
            elif node.module == "kopf":
                yield from ((node.lineno, f"from kopf import {a.name}") for a in node.names if a.name.startswith("_"))
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if isinstance(node.value, ast.Name) and node.value.id in names:
                yield node.lineno, f"{node.value.id}.{node.attr}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            match node.args:
                case [ast.Name(id=owner), ast.Constant(value=str(attr)), *_] if owner in names and attr.startswith("_"):
                    yield node.lineno, f"getattr({owner}, {attr!r})"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and PRIVATE.fullmatch(node.value):
            yield node.lineno, repr(node.value)


def shipped_modules() -> Iterator[Path]:
    for folder in SHIPPED:
        yield from (p for p in sorted((ROOT / folder).rglob("*.py")) if "__pycache__" not in p.parts)


def test_the_scan_catches_every_way_in() -> None:
    source = """
import kopf
import kopf as k
import kopf._cogs.structs.references
import kopf._core.reactor.queueing as queueing
from kopf._core.reactor import orchestration
from kopf import _kits
x = kopf._core.reactor.queueing.watcher
y = k._cogs
z = getattr(kopf, "_core")
importlib.import_module("kopf._core.reactor.queueing")
"""
    assert sorted(line for line, _ in reaches(source)) == [4, 5, 6, 7, 8, 9, 10, 11]


def test_the_scan_leaves_kopf_s_public_api_alone() -> None:
    source = '''
"""A docstring may mention kopf._core.reactor.queueing.watcher."""
import kopf
import kopf.on
from kopf import on, Memo
kopf.operator(memo=kopf.Memo(), insights=None)
registry._indexing  # a private attribute of a kopf object, read by name: the guard's REGISTRY covers the fence's
'''
    assert list(reaches(source)) == []


def test_only_the_fence_reaches_into_kopf_s_private_modules() -> None:
    outside = [f"{path.relative_to(ROOT)}:{line}: {what}"
               for path in shipped_modules() if str(path.relative_to(ROOT)) not in FENCE
               for line, what in reaches(path.read_text())]
    assert outside == [], ("kopf's private modules are reached only from operator/kopf_fixes.py, kopf_watch.py and "
                           "kopf_support.py, whose guard checks the kopf they run on; move this there, or use "
                           "kopf's public API:\n" + "\n".join(outside))


def test_the_fence_exists_and_reaches_in() -> None:
    for module in FENCE:
        assert list(reaches((ROOT / module).read_text())), f"{module} no longer reaches into kopf: shrink the fence"


def test_the_import_contract_ignores_only_the_fence() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    contract = config["importlinter:contract:kopf-fence"]
    importers = {line.split("->")[0].strip() for line in contract["ignore_imports"].split("\n") if line.strip()}
    assert importers <= {f"pdfleet.{m.removesuffix('.py').replace('/', '.')}" for m in FENCE}
    assert {"kopf._core", "kopf._cogs", "kopf._kits"} <= set(contract["forbidden_modules"].split())


def test_every_private_module_the_fence_imports_holds_a_fingerprinted_target() -> None:
    imported = set()
    for module in FENCE:
        for node in ast.walk(ast.parse((ROOT / module).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and _private(node.module):
                imported |= {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names if _private(a.name)}
    assert imported, "the fence imports nothing of kopf's: this test reads the wrong files"
    unguarded = sorted(m for m in imported if not any(t.startswith(f"{m}.") for t in kopf_support.TARGETS))
    assert unguarded == [], f"add a fingerprint of what the fence uses from {unguarded} to kopf_support.SUPPORTED"


def test_the_kopf_private_packages_are_the_ones_fenced() -> None:
    """A new private package in kopf (kopf._x) would be outside the import contract's forbidden list."""
    import kopf

    packages = {p.name for p in Path(kopf.__file__).parent.iterdir() if p.name.startswith("_") and p.is_dir()
                and p.name != "__pycache__"}
    assert packages == {"_core", "_cogs", "_kits"}
