"""What tests need to put pdfleet on the local cluster's real node (hack/realnode.py): the images `make images`
built, pushed into the node's registry under the names the chart and pools use, and the scheduling that lands a
pod there (the node's own taint keeps everything else away)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))
import realnode  # noqa: E402  (hack/ is not a package)

from hack.images import build  # noqa: E402

NODE = realnode.NODE_NAME
NODE_SELECTOR = {realnode.LABEL: "true"}
TOLERATIONS = [{"key": realnode.TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]


@dataclasses.dataclass(frozen=True)
class Pushed:
    repository: str  # as the chart and pools name it (ghcr.io/pdfleet/...): the node mirrors every registry
    tag: str
    digest: str

    @property
    def pinned(self) -> str:
        return f"{self.repository}@{self.digest}"


def push_images(*names: str) -> dict[str, Pushed]:
    """Each image of `make images`' index pushed into the node's registry; the registry must hold the very digest
    the build made (a copy that changed it would be running something else)."""
    index_path = build.CACHE / "index.json"
    if not index_path.exists():
        pytest.fail(f"no images built ({index_path} is missing): run `make images` (make test does)", pytrace=False)
    index = json.loads(index_path.read_text())["images"]
    out = {}
    for name in names:
        if name not in index:
            pytest.fail(f"image {name} is not in {index_path}: run `make images`", pytrace=False)
        entry = index[name]
        held = realnode.push(Path(entry["archive"]), entry["reference"])
        assert held == entry["digest"], f"the registry holds {held} for {name}, the build made {entry['digest']}"
        repository, tag = entry["reference"].rsplit(":", 1)
        out[name] = Pushed(repository, tag, held)
    return out


def kill_container(container_id: str) -> None:
    """SIGKILL a container of the node through its runc, as a crash or an OOM kill would end it (no preStop)."""
    cid = container_id.removeprefix("containerd://")
    subprocess.run(["runc", "--root", str(realnode.RUN / "runc" / "k8s.io"), "kill", cid, "KILL"], check=True,
                   capture_output=True, text=True)
