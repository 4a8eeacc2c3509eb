"""What tests need to put pdfleet on the local cluster's real node (hack/realnode.py): the images `make images`
built, pushed into the node's registry under the names the chart and pools use, and the scheduling that lands a
pod there (the node's own taint keeps everything else away)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))
import realnode  # noqa: E402  (hack/ is not a package)

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
    """Each image of `make images`' index pushed into the node's registry (hack/realnode.py checks that the
    registry holds the very digest the build made)."""
    try:
        pushed = realnode.push_built(list(names))
    except realnode.lc.ClusterError as e:
        pytest.fail(str(e), pytrace=False)
    return {name: Pushed(*ref.rsplit(":", 1), digest) for name, (ref, digest) in pushed.items()}


def kill_container(container_id: str) -> None:
    """SIGKILL a container of the node through its runc, as a crash or an OOM kill would end it (no preStop)."""
    cid = container_id.removeprefix("containerd://")
    subprocess.run(["runc", "--root", str(realnode.RUN / "runc" / "k8s.io"), "kill", cid, "KILL"], check=True,
                   capture_output=True, text=True)
