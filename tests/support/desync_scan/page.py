"""docs/desync-audit.md's "Reachable collectives" table, read and held against a scan.

A row is `| `site:primitive` | `Entry.a`, `Entry.b` | status |`: the collective's key (scan.Collective.key,
free of line numbers), every entry the scan reaches it from (the loops' direct calls and the dispatched
handlers, short names as `scan.short` writes them) and a status that starts with one of `STATUSES`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.support.desync_scan.scan import Scan, short

SECTION = "## Reachable collectives"
STATUSES = ("fixed by", "lockstep by construction", "out of scope", "OPEN")


@dataclass(frozen=True)
class Row:
    key: str
    entries: frozenset[str]
    status: str


def rows(page: str) -> dict[str, Row]:
    start = page.index(SECTION)
    end = page.find("\n## ", start + len(SECTION))
    found: dict[str, Row] = {}
    for line in page[start:end if end != -1 else len(page)].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`sglang."):
            continue
        key = cells[0].strip("`")
        found[key] = Row(key, frozenset(re.findall(r"`([^`]+)`", cells[1])), cells[2])
    return found


def problems(found: Scan, page: str) -> list[str]:
    """One line per difference: a collective without a row, a row the scan no longer finds, an entry the row
    does not name (or names but the scan no longer finds), a row without a known status."""
    listed = rows(page)
    lines = []
    for key in sorted(set(found.collectives) - set(listed)):
        collective = found.collectives[key]
        path = " -> ".join(short(step.function) for step in collective.chain)
        lines.append(f"no row for {key}, reached from {sorted(short(e) for e in collective.entries)} "
                     f"(e.g. {path})")
    for key in sorted(set(listed) - set(found.collectives)):
        lines.append(f"row {key}: the scan no longer reaches it")
    for key in sorted(set(listed) & set(found.collectives)):
        entries = {short(e) for e in found.collectives[key].entries}
        if missing := sorted(entries - listed[key].entries):
            lines.append(f"row {key}: does not name the entries {missing}")
        if gone := sorted(listed[key].entries - entries):
            lines.append(f"row {key}: names entries the scan no longer reaches it from: {gone}")
    for key, row in sorted(listed.items()):
        if not row.status.startswith(STATUSES):
            lines.append(f"row {key}: status must start with one of {STATUSES}")
    return lines


def skeleton(found: Scan) -> str:
    """Rows for every collective the scan finds, status OPEN: the start of a re-audit."""
    return "\n".join(
        f"| `{key}` | {', '.join(f'`{e}`' for e in sorted(short(e) for e in c.entries))} | OPEN |"
        for key, c in sorted(found.collectives.items()))
