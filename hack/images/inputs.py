"""Cache keys: a layer is rebuilt only when something that goes into it changed.

A key is the sha256 of named inputs: files (by path relative to the repository and content; never mtimes, and
never byte code or build leftovers) and plain values (package lists, settings). Renaming a file, changing a
byte of one, adding or removing one changes the key; touching one or compiling it does not.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

IGNORED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".ruff_cache"})
IGNORED_SUFFIXES = (".pyc", ".pyo")


def source_files(root: Path, paths: Iterable[str]) -> Iterator[Path]:
    """Every file under root/paths (a path may name a file), sorted, less byte code and caches."""
    for top in sorted(set(paths)):
        path = root / top
        if path.is_file():
            yield path
            continue
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: an input of an image is missing")
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS and not d.endswith(".egg-info"))
            for name in sorted(filenames):
                if not name.endswith(IGNORED_SUFFIXES):
                    yield Path(dirpath) / name


def key(root: Path, paths: Iterable[str] = (), values: Mapping[str, object] | None = None) -> str:
    """The hex sha256 of the files under `paths` (relative to root) and of `values`."""
    sha = hashlib.sha256()
    for path in source_files(root, paths):
        name = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        sha.update(b"file\0%s\0%d\0" % (name, len(data)))
        sha.update(data)
    for name, value in sorted((values or {}).items()):
        text = repr(value).encode()
        sha.update(b"value\0%s\0%d\0" % (name.encode(), len(text)))
        sha.update(text)
    return sha.hexdigest()
