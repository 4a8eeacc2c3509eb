"""The downward-API volume of a pod's annotations, as kubelet writes it: `key="value"` lines sorted by key,
values quoted the way Go's %q quotes them, no trailing newline, replaced atomically on every change."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
            "\\": "\\\\", '"': '\\"'}


def go_quote(value: str) -> str:
    """strconv.Quote: printable characters stay, the rest are escaped."""
    out = []
    for ch in value:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def format_map(values: Mapping[str, str]) -> str:
    """kubelet's fieldpath.FormatMap."""
    return "\n".join(f"{key}={go_quote(values[key])}" for key in sorted(values))


def write_atomically(path: Path, text: str, mode: int = 0o644) -> bool:
    """Replaces `path` with `text` unless it already holds exactly that; True when it wrote. Readers never see
    a half-written file: the new content is renamed over the old one."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)  # the umask may have narrowed it
    tmp.replace(path)
    return True


def write_annotations(podinfo_dir: Path, annotations: Mapping[str, str]) -> bool:
    return write_atomically(podinfo_dir / "annotations", format_map(annotations))
