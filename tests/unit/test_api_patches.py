"""The runtime patch catalogue: plain data the operator and the launcher both read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pdfleet.runtime.patches import catalogue


def test_patch_ids_are_unique_lowercase_words() -> None:
    assert len(set(catalogue.IDS)) == len(catalogue.IDS)
    for patch_id in catalogue.IDS:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", patch_id), patch_id


def test_every_patch_names_its_targets_as_dotted_sglang_names() -> None:
    for patch in catalogue.CATALOGUE:
        assert patch.targets, patch.id
        for target in patch.targets:
            assert re.fullmatch(r"sglang(\.[A-Za-z_][A-Za-z0-9_]*)+", target), target


def test_a_patch_fixed_upstream_does_not_apply_from_that_version_on() -> None:
    for patch in catalogue.CATALOGUE:
        if patch.fixed_in is not None:
            assert patch.fixed_in not in patch.applies_to, patch.id


def test_the_catalogue_imports_only_the_standard_library() -> None:
    source = Path(catalogue.__file__).read_text()
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "dataclasses", "re"}


@pytest.mark.parametrize(("lower", "higher"), [
    ("0.5.9", "0.5.23"),
    ("0.5.24rc1", "0.5.24"),
    ("0.5.23", "0.5.23.post1"),
    ("0.5.23.dev0", "0.5.23a1"),
    ("0.5", "0.5.1"),
])
def test_versions_sort_like_pep_440(lower: str, higher: str) -> None:
    assert catalogue.version_key(lower) < catalogue.version_key(higher)


def test_a_version_range_includes_its_minimum_and_excludes_its_bound() -> None:
    versions = catalogue.VersionRange(min="0.5.0", below="0.5.23")
    assert "0.5.0" in versions
    assert "0.5.22" in versions
    assert "0.5.23" not in versions
    assert "0.4.9" not in versions
    assert "0.9.0" in catalogue.VersionRange(min="0.5.0")


def test_text_that_is_not_a_version_is_refused() -> None:
    with pytest.raises(ValueError, match="not a version"):
        catalogue.version_key("latest")
