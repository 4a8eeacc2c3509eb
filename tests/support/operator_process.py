"""The real operator as a separate process, with the credentials of the chart's ServiceAccount.

Running it with a token of that ServiceAccount (from the TokenRequest API), not the admin certificate, is the
point: a permission the chart forgot makes the operator fail here exactly as it would in a cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.support.cluster import Cluster, wait_for
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def token_kubeconfig(cluster: Cluster, namespace: str, service_account: str, path: Path) -> Path:
    token = cluster.kubectl("create", "token", service_account, "-n", namespace, "--duration=2h").stdout.strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": cluster.server,
                                               "certificate-authority": str(cluster.ca_file)}}],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": service_account}}],
        "current-context": "c",
    }))
    path.chmod(0o600)
    return path


class OperatorProcess:
    def __init__(self, kubeconfig: Path, log_path: Path, *extra: str) -> None:
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.log_path = log_path
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pdfleet.operator", "--kubeconfig", str(kubeconfig),
             "--metrics-port", str(self.metrics_port), "--health-port", str(self.health_port),
             "--bind-address", "127.0.0.1", "--log-format", "json", *extra],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
        )

    def _get(self, port: int, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except OSError:
            return 0, ""

    def probe(self, path: str) -> tuple[int, str]:
        """The operator's answer on its health port to `path` (/healthz, /readyz): status (0 if none) and body."""
        return self._get(self.health_port, path)

    def wait_ready(self, timeout: float = 60) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the operator exited with {self.proc.returncode}:\n{self.logs()[-4000:]}")
            return self._get(self.health_port, "/readyz")[0] == 200
        wait_for("the operator to be ready", ready, timeout=timeout)

    def metrics(self) -> str:
        return self._get(self.metrics_port, "/metrics")[1]

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            series, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total

    def logs(self) -> str:
        if not self._log.closed:  # still readable once the process is stopped
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_records(self) -> list[dict]:
        records = []
        for line in self.logs().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
        return records

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@contextlib.contextmanager
def running_operator(kubeconfig: Path, log_path: Path, *extra: str) -> Iterator[OperatorProcess]:
    op = OperatorProcess(kubeconfig, log_path, *extra)
    try:
        op.wait_ready()
        yield op
    finally:
        op.stop()
