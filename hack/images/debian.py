"""Debian root filesystems made here with mmdebstrap (never a pulled base image), and commands run inside one.

Debian 12 (bookworm) has python3.11, the Python pdfleet needs. The `essential` variant has no apt: packages
named with --include are installed by mmdebstrap from outside, so the image never carries a package manager
that could fetch anything. Documentation, man pages and locales are left out by dpkg (copyright files stay).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

SUITE = "bookworm"
MIRROR = os.environ.get("PDFLEET_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SECURITY = os.environ.get("PDFLEET_DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
SOURCES = (f"deb {MIRROR} {SUITE} main", f"deb {MIRROR} {SUITE}-updates main",
           f"deb {SECURITY} {SUITE}-security main")
DPKG_OPTIONS = ("path-exclude=/usr/share/man/*", "path-exclude=/usr/share/doc/*",
                "path-include=/usr/share/doc/*/copyright", "path-exclude=/usr/share/locale/*",
                "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/lintian/*")
# Left by the build, never part of an image: apt's lists and caches, logs, the host's resolver and name.
LEFTOVERS = ("var/lib/apt/lists", "var/cache/apt", "var/log", "var/cache/ldconfig/aux-cache",
             "var/cache/debconf/config.dat-old", "var/cache/debconf/templates.dat-old", "var/lib/dpkg/status-old",
             "var/lib/dpkg/diversions-old", "etc/resolv.conf", "etc/hostname")
NONROOT = 65532


class BuildError(RuntimeError):
    """A build step failed; the message says which and where its log is."""


def run_logged(argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None, what: str) -> None:
    with log.open("ab") as out:
        out.write(f"$ {shlex.join(argv)}\n".encode())
        out.flush()
        result = subprocess.run(list(argv), stdout=out, stderr=subprocess.STDOUT, env=dict(env or os.environ))
    if result.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        raise BuildError(f"{what} failed (exit {result.returncode}); last lines of {log}:\n" + "\n".join(tail))


def mmdebstrap(target: Path, packages: Sequence[str], log: Path, *, variant: str = "essential",
               epoch: int) -> None:
    """A bookworm root filesystem in `target` with `packages` installed (variant `extract`: only unpacked)."""
    if target.exists():
        shutil.rmtree(target)
    argv = ["mmdebstrap", "--mode=root", f"--variant={variant}", "--quiet",
            *(f"--dpkgopt={o}" for o in DPKG_OPTIONS)]
    if packages:
        argv.append("--include=" + ",".join(packages))
    argv += [SUITE, str(target), *SOURCES]
    run_logged(argv, log, env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}, what=f"mmdebstrap {target.name}")


def installed_packages(root: Path) -> dict[str, str]:
    """name -> version of every package dpkg installed in root."""
    out = subprocess.run(["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Package}=${Version}\n"],
                         check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in sorted(out.splitlines()) if line)


def clean(root: Path) -> None:
    """Remove what the build leaves behind, and give the non-root user a name."""
    for name in LEFTOVERS:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        elif path.exists() or path.is_symlink():
            path.unlink()
    add_user(root)


def add_user(root: Path, uid: int = NONROOT, name: str = "nonroot") -> None:
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    for file, line in (("passwd", f"{name}:x:{uid}:{uid}:{name}:/tmp:/usr/sbin/nologin\n"),
                       ("group", f"{name}:x:{uid}:\n")):
        path = etc / file
        text = path.read_text() if path.exists() else ""
        if not any(entry.split(":")[0] == name for entry in text.splitlines()):
            path.write_text(text + line)


def chroot(root: Path, argv: Sequence[str], log: Path, *, what: str, env: Mapping[str, str] | None = None,
           binds: Sequence[tuple[Path, str]] = (), network: bool = False) -> None:
    """Run argv inside root, in a mount namespace of its own (/proc, /dev and `binds` mounted there vanish
    with it). network=True gives it the host's resolver, for pip to reach the package index."""
    mounts = [f"mount -t proc proc {shlex.quote(str(root / 'proc'))}",
              f"mount --rbind /dev {shlex.quote(str(root / 'dev'))}"]
    for host, inside in binds:
        (root / inside.lstrip("/")).mkdir(parents=True, exist_ok=True)
        mounts.append(f"mount --bind {shlex.quote(str(host))} {shlex.quote(str(root / inside.lstrip('/')))}")
    if network:
        shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
    environment = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                   "LC_ALL": "C.UTF-8", **(env or {})}
    script = " && ".join([*mounts, "exec env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in environment.items())
                          + f" chroot {shlex.quote(str(root))} " + shlex.join(argv)])
    try:
        run_logged(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], log, what=what)
    finally:
        if network:
            (root / "etc" / "resolv.conf").unlink(missing_ok=True)


def recompile(root: Path, directories: Sequence[str], log: Path, python: str = "/usr/bin/python3") -> None:
    """Byte code for everything under `directories` (inside root), compiled by the image's own Python in
    unchecked-hash mode: the same bytes on every build, valid whatever the files' mtimes, and nothing for a
    non-root user to rewrite at start."""
    for directory in directories:
        for cache in sorted((root / directory.lstrip("/")).rglob("__pycache__"), reverse=True):
            shutil.rmtree(cache)
    # compileall exits 1 when a file does not compile (test data written for Python 2 in some packages):
    # those files are never imported, so their failure is logged, not fatal.
    chroot(root, ["sh", "-c", f"{python} -m compileall -q -j 2 --invalidation-mode unchecked-hash "
                  + " ".join(shlex.quote(d) for d in directories) + " || true"], log, what="compileall")
