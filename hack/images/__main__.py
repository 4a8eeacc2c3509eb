"""Command line of hack/images: build, lock, run (see __init__.py)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from hack.images import build, debian, runc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.images", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    building = commands.add_parser("build", help="build (or find cached) the images; print and index them")
    building.add_argument("names", nargs="*", help="images to build (default: all)")
    commands.add_parser("lock", help="regenerate requirements/operator.lock")
    running = commands.add_parser("run", help="run a built image's command with runc, as its user")
    running.add_argument("name")
    running.add_argument("args", nargs=argparse.REMAINDER, help="-- and the process's argv (default: the image's)")
    commands.add_parser("index", help="print images/index.json")
    options = parser.parse_args(argv)
    try:
        if options.command == "build":
            build.build(options.names)
        elif options.command == "lock":
            build.lock()
        elif options.command == "index":
            print((build.CACHE / "index.json").read_text(), end="")
        else:
            args = [a for a in options.args if a != "--"] if options.args[:1] == ["--"] else options.args
            entry = json.loads((build.CACHE / "index.json").read_text())["images"][options.name]
            result = runc.run_image(entry["archive"], args or None)
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
            return result.returncode
    except (debian.BuildError, runc.RuncError) as error:
        print(f"images: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
