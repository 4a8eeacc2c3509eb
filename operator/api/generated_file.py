"""The command line of a generator that writes one file of the repository from the code (`make crds`), or checks
that the committed copy is current (`--check`, as the unit tests do)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def main(render: Callable[[], str], output: Path, doc: str | None, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=output)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.output.is_file() or args.output.read_text() != text:
            print(f"{args.output} is stale: regenerate it with `make crds`", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0
