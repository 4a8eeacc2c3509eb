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
DOORS_SECTION = "## Doors from outside the loop"
DOOR_STATUSES = ("refused at the engine", "refused at admission", "open")


@dataclass(frozen=True)
class Row:
    key: str
    entries: frozenset[str]
    status: str


def _table(page: str, section: str, first: re.Pattern[str]) -> dict[str, Row]:
    start = page.index(section)
    end = page.find("\n## ", start + len(section))
    found: dict[str, Row] = {}
    for line in page[start:end if end != -1 else len(page)].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not first.fullmatch(cells[0]):
            continue
        key = cells[0].strip("`")
        found[key] = Row(key, frozenset(re.findall(r"`([^`]+)`", cells[1])), cells[2])
    return found


def rows(page: str) -> dict[str, Row]:
    return _table(page, SECTION, re.compile(r"`sglang\.[^`]+`"))


def door_rows(page: str) -> dict[str, Row]:
    """The doors table: `| `POST /path` or `gRPC RuntimeHandle.method` | `Handler.names` | status |`."""
    return _table(page, DOORS_SECTION, re.compile(r"`(?:[A-Z,]+ /|gRPC )[^`]+`"))


def door_problems(found: Scan, page: str) -> list[str]:
    """A door the scan maps to handlers without a row, a row for a door it no longer finds, handlers that differ,
    a status not in DOOR_STATUSES."""
    listed = door_rows(page)
    lines = [f"no door row for {door}, dispatched to {sorted(short(h) for h in found.doors[door])}"
             for door in sorted(set(found.doors) - set(listed))]
    lines += [f"door row {door}: the scan no longer finds it" for door in sorted(set(listed) - set(found.doors))]
    for door in sorted(set(listed) & set(found.doors)):
        if (handlers := {short(h) for h in found.doors[door]}) != listed[door].entries:
            lines.append(f"door row {door}: handlers {sorted(handlers)}, the row names {sorted(listed[door].entries)}")
    lines += [f"door row {door}: status must start with one of {DOOR_STATUSES}"
              for door, row in sorted(listed.items()) if not row.status.startswith(DOOR_STATUSES)]
    return lines


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
