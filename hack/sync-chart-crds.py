#!/usr/bin/env python3
"""Copies the generated CRDs from crds/ into the Helm chart's crds/ folder, which Helm installs before the
templates (and never templates).

    python hack/sync-chart-crds.py            # copy crds/*.yaml into charts/pdfleet/crds/, drop stale files
    python hack/sync-chart-crds.py --check    # change nothing; exit 1 and say what differs

crds/ is the source of truth (generated from the API models by `python -m pdfleet.operator.api.crd`); the
chart's copy is a byte-for-byte duplicate, so that the packaged chart is self-contained. Run this after every
regeneration; tests/unit/test_chart_crds.py runs --check.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path("crds")
CHART_CRDS = Path("charts/pdfleet/crds")
REQUIRED = ("inferencepools.pdfleet.dev.yaml",)
GENERATE = "python -m pdfleet.operator.api.crd"
SYNC = "python hack/sync-chart-crds.py"


class SyncError(Exception):
    pass


def plan(root: Path) -> tuple[list[str], list[str]]:
    """What syncing would do: (names to copy because missing or different, stale names to remove)."""
    source, chart = root / SOURCE, root / CHART_CRDS
    missing = [name for name in REQUIRED if not (source / name).is_file()]
    if missing:
        raise SyncError(f"{', '.join(str(SOURCE / n) for n in missing)} does not exist: generate it first with "
                        f"`{GENERATE}`, then run `{SYNC}`")
    wanted = {p.name: p.read_bytes() for p in sorted(source.glob("*.yaml"))}
    present = {p.name: p.read_bytes() for p in sorted(chart.glob("*.yaml"))} if chart.is_dir() else {}
    to_copy = [name for name, data in wanted.items() if present.get(name) != data]
    stale = [name for name in present if name not in wanted]
    return to_copy, stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the chart's CRDs differ")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        to_copy, stale = plan(args.root)
    except SyncError as e:
        print(f"sync-chart-crds: {e}", file=sys.stderr)
        return 1
    if args.check:
        if not to_copy and not stale:
            return 0
        lines = [f"  {CHART_CRDS / n} differs from {SOURCE / n} (or is missing)" for n in to_copy]
        lines += [f"  {CHART_CRDS / n} has no counterpart in {SOURCE}/ (stale)" for n in stale]
        print("sync-chart-crds: the chart's CRDs are out of date:\n" + "\n".join(lines) + f"\nfix: run `{SYNC}`",
              file=sys.stderr)
        return 1
    chart = args.root / CHART_CRDS
    chart.mkdir(parents=True, exist_ok=True)
    for name in to_copy:
        shutil.copyfile(args.root / SOURCE / name, chart / name)
        print(f"copied {SOURCE / name} -> {CHART_CRDS / name}")
    for name in stale:
        (chart / name).unlink()
        print(f"removed stale {CHART_CRDS / name}")
    if not to_copy and not stale:
        print(f"{CHART_CRDS} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
