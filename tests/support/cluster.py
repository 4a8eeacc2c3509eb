"""A handle on the cluster under test, and the waiting that tests do on it."""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    pass


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60, interval: float = 0.2) -> T:
    """Polls `probe` until it returns something truthy and returns that; fails with `what` on timeout.
    Tests wait for conditions this way, never by sleeping a fixed time."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@dataclasses.dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    bin_dir: Path
    is_local: bool = True  # False when PDFLEET_KUBECONFIG names an existing cluster (kind, say)

    @property
    def env(self) -> dict[str, str]:
        return os.environ | {"KUBECONFIG": str(self.kubeconfig), "PATH": f"{self.bin_dir}:{os.environ['PATH']}"}

    def run(self, tool: str, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([tool, *args], input=input, text=True, capture_output=True, env=self.env,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{tool} {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
        return proc

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run("kubectl", *args, input=input, check=check, timeout=timeout)

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.run("helm", *args, check=check, timeout=timeout)

    def get(self, *args: str) -> Any:
        """`kubectl get ... -o json`, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def wait_established(self, *names: str, timeout: float = 60) -> None:
        """Waits until each CRD is Established. Not `kubectl wait --for=condition=Established`: on a CRD so new
        that the apiserver has not written its conditions yet, kubectl 1.34 fails at once ('.status.conditions
        accessor error: <nil>') instead of waiting, which a busy fresh cluster showed twice."""
        query = '{.status.conditions[?(@.type=="Established")].status}'
        for name in names:
            wait_for(f"CRD {name} Established", lambda name=name: self.kubectl(
                "get", "crd", name, "-o", f"jsonpath={query}", check=False).stdout.strip() == "True" or None,
                timeout=timeout)

    @property
    def audit_log(self) -> Path:
        """The local apiserver's audit log of writes (hack/audit-policy.yaml)."""
        return self.kubeconfig.parent / "logs" / "audit.log"

    def restart_local(self) -> None:
        """Starts whatever part of the local control plane is not running (after a test stopped it)."""
        root = Path(__file__).resolve().parents[2]
        proc = subprocess.run([sys.executable, str(root / "hack" / "localcluster.py"), "up"], text=True,
                              capture_output=True, timeout=300)
        if proc.returncode != 0:
            raise AssertionError(f"localcluster up failed:\n{proc.stderr}")

    @functools.cached_property
    def _cluster_entry(self) -> dict[str, Any]:
        config = json.loads(self.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
        return config["clusters"][0]["cluster"]

    @property
    def server(self) -> str:
        return self._cluster_entry["server"]

    @functools.cached_property
    def ca_file(self) -> Path:
        """The cluster's CA bundle as a file, for clients that are given a token instead of the kubeconfig."""
        entry = self._cluster_entry
        if "certificate-authority" in entry:
            return Path(entry["certificate-authority"])
        fd, name = tempfile.mkstemp(prefix="pdfleet-ca-", suffix=".crt")
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(entry["certificate-authority-data"]))
        return Path(name)
