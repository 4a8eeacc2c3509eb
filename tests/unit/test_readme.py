"""The README is an entry point that stays true: its pool is examples/minimal.yaml as written, it stays short, and
every relative link in it and in docs/ reaches a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
EXAMPLE_MARK = "<!-- example: examples/minimal.yaml, checked by tests/unit/test_readme.py -->"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_s_pool_is_the_minimal_example_as_written() -> None:
    text = README.read_text()
    assert EXAMPLE_MARK in text, "README.md lost its example mark"
    block = re.match(r"\s*```yaml\n(.*?)\n```", text.split(EXAMPLE_MARK, 1)[1], re.S)
    assert block, "the example mark is not followed by a ```yaml block"
    assert yaml.safe_load(block.group(1)) == yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())


def test_the_readme_is_short_enough_to_be_read_first() -> None:
    assert len(README.read_text().splitlines()) < 150


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "charts/pdfleet/README.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of the page itself
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to what does not exist: {broken}"
