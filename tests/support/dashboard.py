"""The chart's Grafana dashboard as the tests read it: its PromQL, the metric names and labels that PromQL uses, and
the series names a Prometheus text scrape offers."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "pdfleet" / "dashboards" / "pdfleet.json"

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][\w:]*")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                       "unless", "offset"})
_LABEL_VALUES = re.compile(r"label_values\(\s*([a-zA-Z_:][\w:]*)\s*,\s*(\w+)\s*\)")


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those folded into collapsed rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """The PromQL of every panel target."""
    return [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(metric, label) of every `label_values(metric, label)` template variable."""
    found = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = _LABEL_VALUES.fullmatch(query.strip())
            assert match, f"variable {variable['name']}: not label_values(metric, label): {query}"
            found.append((match[1], match[2]))
    return found


def metric_names(expr: str) -> set[str]:
    """The series names an expression selects: identifiers that are neither functions, keywords, label names
    nor label values."""
    text = _GROUPING.sub(" ", _STRING.sub('""', expr))
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    return {m[0] for m in _IDENTIFIER.finditer(text)
            if m[0] not in _KEYWORDS and not re.match(r"\s*\(", text[m.end():])}


def label_names(expr: str) -> dict[str, set[str]]:
    """Per series name, the labels the expression matches on or groups by (one series name per expression
    expected for grouping: the dashboard's expressions aggregate one family each)."""
    bare = _STRING.sub('""', expr)
    used: dict[str, set[str]] = {name: set() for name in metric_names(expr)}
    for name, matchers in _SELECTOR.findall(bare):
        used.setdefault(name, set()).update(_MATCHER.findall(matchers))
    grouped = {label.strip() for clause in _GROUPING.findall(bare) for label in clause.split(",") if label.strip()}
    for labels in used.values():
        labels.update(grouped)
    return used


def offered_series(scrape: str) -> set[str]:
    """The series names a Prometheus text scrape offers: every sample's name, and for each declared family
    (`# TYPE`, which prometheus_client prints even before a labelled family has its first sample) the names
    its samples take."""
    names = set()
    for line in scrape.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            if kind == "counter":
                names.add(family if family.endswith("_total") else f"{family}_total")
            elif kind == "histogram":
                names.update(f"{family}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
            elif kind == "summary":
                names.update((family, f"{family}_sum", f"{family}_count"))
            else:
                names.add(family)
        elif line and not line.startswith("#"):
            names.add(_IDENTIFIER.match(line)[0])
    return names
