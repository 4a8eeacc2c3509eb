"""What every pod worker shares: the apiserver client, the zygote, the event recorder, the probe session,
where pods keep their state, and which pod holds which IP and directory."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import aiohttp

from pdfleet.podrunner.claims import Claims
from pdfleet.podrunner.events import Recorder
from pdfleet.podrunner.kube import Client
from pdfleet.podrunner.processes import Zygote


@dataclasses.dataclass
class Node:
    client: Client
    zygote: Zygote
    events: Recorder
    probe_session: aiohttp.ClientSession
    python: str
    cluster_dir: Path
    shutdown_grace_s: float
    claims: Claims = dataclasses.field(default_factory=Claims)

    def pod_dir(self, namespace: str, name: str) -> Path:
        return self.cluster_dir / "pods" / namespace / name

    @property
    def container_path(self) -> str:
        """PATH inside a container: the project's interpreter and console scripts first."""
        return os.pathsep.join([str(Path(self.python).parent), "/usr/local/bin", "/usr/bin", "/bin"])
