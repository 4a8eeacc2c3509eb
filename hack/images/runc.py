"""Run a built image with runc, as a container runtime would: the archive's layout unpacked by umoci into an
OCI bundle (its config.json made from the image's: user, env, working directory, entrypoint and cmd), then
`runc run`. Used by the integration test and `python -m hack.images run`."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

TOOLS = {"umoci": "umoci", "runc": "runc", "skopeo": "skopeo"}  # command -> Debian package
_ids = itertools.count()


class RuncError(RuntimeError):
    """A tool is missing or a step failed; the message says which."""


def missing_tools(names: Sequence[str] = ("umoci", "runc")) -> list[str]:
    return [TOOLS[n] for n in names if shutil.which(n) is None]


def require_tools(names: Sequence[str] = ("umoci", "runc")) -> None:
    missing = missing_tools(names)
    if missing:
        raise RuncError(f"missing {', '.join(missing)}: apt-get install {' '.join(missing)} (Debian packages)")
    if os.geteuid() != 0:
        raise RuncError("running an image with runc here needs root (umoci unpack and runc run without rootless "
                        "setup)")


class Bundle:
    """An image unpacked once into an OCI bundle, to run any number of processes from."""

    def __init__(self, archive: str | Path, workdir: Path) -> None:
        require_tools()
        self.workdir = workdir
        layout = workdir / "layout"
        layout.mkdir()
        with tarfile.open(archive) as tar:
            tar.extractall(layout, filter="fully_trusted")
        index = json.loads((layout / "index.json").read_text())
        tag = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
        self.path = workdir / "bundle"
        result = subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(self.path)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuncError(f"umoci unpack {archive} failed: {result.stderr.strip()}")
        shutil.rmtree(layout)
        self.config: dict[str, Any] = json.loads((self.path / "config.json").read_text())

    def run(self, args: Sequence[str] | None = None, *, env: Mapping[str, str] | None = None,
            timeout: float = 300, user: tuple[int, int] | None = None,
            mounts: Sequence[tuple[Path, str]] = ()) -> subprocess.CompletedProcess[str]:
        """Run args (default: the image's entrypoint and cmd) in a fresh container of this bundle; its output
        and exit status. env adds to the image's environment; mounts bind host directories (read-write)."""
        config = json.loads(json.dumps(self.config))
        process = config["process"]
        process["terminal"] = False
        if args is not None:
            process["args"] = list(args)
        if env:
            process["env"] = [*process.get("env", []), *(f"{k}={v}" for k, v in env.items())]
        if user is not None:
            process["user"]["uid"], process["user"]["gid"] = user
        config["mounts"] = [*config.get("mounts", []), *({"destination": inside, "source": str(host), "type": "bind",
                                                            "options": ["rbind", "rw"]} for host, inside in mounts)]
        (self.path / "config.json").write_text(json.dumps(config))
        name = f"pdfleet-images-{os.getpid()}-{next(_ids)}"
        try:
            return subprocess.run(["runc", "run", "--bundle", str(self.path), name], capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        finally:
            subprocess.run(["runc", "delete", "--force", name], capture_output=True)

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"


@contextlib.contextmanager
def unpacked(archive: str | Path) -> Iterator[Bundle]:
    with tempfile.TemporaryDirectory(prefix="pdfleet-image-") as tmp:
        yield Bundle(archive, Path(tmp))


def run_image(archive: str | Path, args: Sequence[str] | None = None) -> subprocess.CompletedProcess[str]:
    with unpacked(archive) as bundle:
        return bundle.run(args)
