"""Every field of the InferencePool API has a test that shows its effect.

A field nobody tests is a field that may do nothing: declared, documented, accepted, and ignored. This module
enumerates every leaf field of the spec from the pydantic models (by its wire name, e.g.
`spec.prefill.scheduling.tolerations.key`) and every `@pytest.mark.effect("<pattern>", ...)` in tests/, read
statically with `ast` so the answer does not depend on which tests were selected. It fails for every field no
effect test claims, and for every pattern that claims no field (a stale marker after a rename or removal).

An effect test sets or changes the field and asserts what follows from it: the rendered pod, the engine's or
router's arguments, a plan decision, the status. A refused value is not an effect, except for a field whose
whole meaning is a constraint.

Patterns are dotted paths in which `*` stands for exactly one segment (`spec.*.tp` is both roles' tp). A
pattern must have as many segments as the field it claims, and more literal segments than wildcards, so no
pattern can claim a whole section by accident.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from pdfleet.operator.api.spec import InferencePoolSpec

TESTS = Path(__file__).resolve().parents[1]
MARKER = "effect"
WILDCARD = "*"


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models a field's type holds, through Optional, unions, tuples, lists, dicts and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None:
        return []
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        args = args[:1]
    elif origin is dict:
        args = args[1:]  # keys are strings; only values can be models
    found: list[type[BaseModel]] = []
    for arg in args:
        for model in _models_in(arg):
            if model not in found:
                found.append(model)
    return found


def leaf_fields(model: type[BaseModel] = InferencePoolSpec, prefix: str = "spec") -> Iterator[str]:
    """Every leaf field's wire path, depth first, in declaration order."""
    for name, field in model.model_fields.items():
        path = f"{prefix}.{field.alias or name}"
        nested = _models_in(field.annotation)
        if not nested:
            yield path
        for inner in nested:
            yield from leaf_fields(inner, path)


@dataclasses.dataclass(frozen=True)
class Claim:
    """One pattern of one `effect` marker, and where it is written."""

    pattern: str
    where: str


def _is_effect_marker(func: ast.expr) -> bool:
    # pytest.mark.effect or mark.effect (after `from pytest import mark`)
    if not (isinstance(func, ast.Attribute) and func.attr == MARKER):
        return False
    owner = func.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "mark") or \
        (isinstance(owner, ast.Name) and owner.id == "mark")


def claims_in(source: str, filename: str) -> Iterator[Claim]:
    """The patterns of every effect marker in a module: decorators, `pytestmark`, `pytest.param(marks=...)`."""
    calls = [node for node in ast.walk(ast.parse(source, filename))
             if isinstance(node, ast.Call) and _is_effect_marker(node.func)]
    for node in sorted(calls, key=lambda call: (call.lineno, call.col_offset)):
        where = f"{filename}:{node.lineno}"
        if not node.args or node.keywords:
            raise ValueError(f"{where}: an effect marker takes field patterns as strings, and nothing else")
        for arg in node.args:
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                raise ValueError(f"{where}: effect patterns must be string literals, found {ast.unparse(arg)}")
            yield Claim(arg.value, where)


def all_claims(root: Path = TESTS) -> list[Claim]:
    return [claim for path in sorted(root.rglob("*.py"))
            for claim in claims_in(path.read_text(), str(path.relative_to(root.parent)))]


def pattern_problem(pattern: str) -> str | None:
    """Why a pattern is not allowed, or None."""
    segments = pattern.split(".")
    if segments[0] != "spec" or any(not s for s in segments):
        return "must be a dotted path starting with spec"
    if any(WILDCARD in s and s != WILDCARD for s in segments):
        return f"{WILDCARD} must be a whole segment"
    wild = segments.count(WILDCARD)
    if len(segments) - wild <= wild:
        return "too broad: it needs more literal segments than wildcards"
    return None


def matches(pattern: str, path: str) -> bool:
    """Segment by segment; `*` is exactly one segment, so a pattern never reaches below its own depth."""
    want, have = pattern.split("."), path.split(".")
    return len(want) == len(have) and all(w in (WILDCARD, h) for w, h in zip(want, have, strict=True))


# ---- the matcher itself -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "path", "expected"), [
    ("spec.*.tp", "spec.prefill.tp", True),
    ("spec.*.tp", "spec.decode.tp", True),
    ("spec.*.tp", "spec.prefill.scheduling.tp", False),
    ("spec.*.scheduling.tolerations.key", "spec.router.scheduling.tolerations.key", True),
    ("spec.prefill", "spec.prefill.tp", False),
    ("spec.paused", "spec.paused", True),
])
def test_a_wildcard_stands_for_exactly_one_segment(pattern: str, path: str, expected: bool) -> None:
    assert matches(pattern, path) is expected


@pytest.mark.parametrize("pattern", ["spec.*", "spec.*.*", "*.model.servedName", "spec.engine.image*", "spec..x",
                                     "model.servedName"])
def test_a_broad_or_malformed_pattern_is_refused(pattern: str) -> None:
    assert pattern_problem(pattern) is not None


def test_markers_are_found_wherever_they_are_written() -> None:
    source = (
        "import pytest\nfrom pytest import mark\n"
        "pytestmark = pytest.mark.effect('spec.paused')\n"
        "@mark.effect('spec.*.tp', 'spec.*.dp')\ndef test_a(): ...\n"
        "@pytest.mark.parametrize('x', [pytest.param(1, marks=pytest.mark.effect('spec.router.port'))])\n"
        "def test_b(x): ...\n"
    )
    assert [c.pattern for c in claims_in(source, "t.py")] == [
        "spec.paused", "spec.*.tp", "spec.*.dp", "spec.router.port"]


def test_a_marker_with_a_computed_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="string literals"):
        list(claims_in("import pytest\nP = 'spec.paused'\n@pytest.mark.effect(P)\ndef test_a(): ...\n", "t.py"))


def test_the_enumeration_walks_nested_models_lists_and_optionals_by_wire_name() -> None:
    fields = set(leaf_fields())
    assert {"spec.paused", "spec.model.servedName", "spec.model.source.pvc.claimName",
            "spec.model.source.hostPath.path", "spec.engine.env.name", "spec.prefill.bootstrapPort",
            "spec.decode.scheduling.tolerations.tolerationSeconds", "spec.router.scheduling.affinity",
            "spec.prefill.resources.requests", "spec.health.restartBudget.window"} <= fields
    assert "spec.decode.bootstrapPort" not in fields
    assert not any(f in ("spec.model", "spec.model.source", "spec.engine.env") for f in fields), \
        "a field holding a model is not a leaf"


# ---- the API against the markers ----------------------------------------------------------------------------

def test_every_effect_pattern_is_well_formed_and_claims_a_real_field() -> None:
    fields = list(leaf_fields())
    problems = []
    for claim in all_claims():
        why = pattern_problem(claim.pattern)
        if why is None and not any(matches(claim.pattern, f) for f in fields):
            why = "matches no field of the API (renamed or removed?)"
        if why is not None:
            problems.append(f"{claim.where}: {claim.pattern!r} {why}")
    assert not problems, "bad effect markers:\n" + "\n".join(problems)


def test_every_field_of_the_api_has_an_effect_test() -> None:
    claims = [c for c in all_claims() if pattern_problem(c.pattern) is None]
    uncovered = [f for f in leaf_fields() if not any(matches(c.pattern, f) for c in claims)]
    assert not uncovered, (
        f"{len(uncovered)} API field(s) have no effect test. Add @pytest.mark.effect(\"<field>\") to a test that "
        "sets the field and asserts what it changes (rendered pod, args, plan, status); if the code ignores the "
        "field, implement it or remove it from the API:\n  " + "\n  ".join(uncovered))
