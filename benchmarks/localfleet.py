"""What the local-fleet benchmarks share: the local cluster with its pod runner, the chart's CRD and RBAC, the
operator running as the chart's ServiceAccount, and a direct HTTPS client of the apiserver.

The benchmarks poll the apiserver every few tens of milliseconds; a kubectl process per read would cost more
than what is measured, so reads go through one `httpx` client holding the kubeconfig's client certificate.
Writes that happen once per injection or per run go through kubectl, as a person would make them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
# A release of its own: the end-to-end tests install and uninstall theirs in pdfleet-system, which deletes the
# ServiceAccount and with it every token of it (the operator then reads 401 Unauthorized mid-run).
RELEASE_NAMESPACE = "pdfleet-bench-system"
SERVICE_ACCOUNT = "pdfleet"
POOLS = "/apis/pdfleet.dev/v1alpha1/namespaces/{namespace}/inferencepools"
FAULT = "sim.pdfleet.dev/fault"

Body = dict[str, Any]
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], *, timeout: float, interval: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def localcluster(*args: str) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "hack" / "localcluster.py"), *args], text=True,
                         capture_output=True)
    if out.returncode != 0:
        raise SystemExit(f"localcluster {' '.join(args)} failed:\n{out.stderr}{out.stdout}")
    return out.stdout


def cluster_up() -> Path:
    """Starts what of the local cluster (the runner included) is not running; returns the kubeconfig, with
    KUBECONFIG and PATH set in this process for kubectl and helm."""
    localcluster("up")
    for line in localcluster("env").splitlines():
        key, value = line.removeprefix("export ").split("=", 1)
        os.environ[key] = value.replace("$PATH", os.environ["PATH"])
    return Path(os.environ["KUBECONFIG"])


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    out = subprocess.run(["kubectl", *args], input=stdin, text=True, capture_output=True)
    if check and out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


def install_chart() -> None:
    """The chart's CRD, ServiceAccount and RBAC, without its operator Deployment (we run the operator here,
    with that ServiceAccount's token, as the end-to-end tests do)."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    out = subprocess.run(["helm", "upgrade", "--install", "pdfleet", str(ROOT / "charts" / "pdfleet"),
                          "--namespace", RELEASE_NAMESPACE, "--create-namespace", "--set", "operator.enabled=false",
                          "--wait"], text=True, capture_output=True)
    if out.returncode != 0:
        raise SystemExit(f"helm install failed:\n{out.stderr}")
    kubectl("wait", "--for=condition=Established", "crd/inferencepools.pdfleet.dev", "--timeout=60s")


def token_kubeconfig(admin: Path, path: Path) -> Path:
    cluster = yaml.safe_load(admin.read_text())["clusters"][0]["cluster"]
    token = kubectl("create", "token", SERVICE_ACCOUNT, "-n", RELEASE_NAMESPACE, "--duration=2h").strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": SERVICE_ACCOUNT}}],
        "current-context": "c",
    }))
    path.chmod(0o600)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_operator(kubeconfig: Path, log_path: Path, namespace: str, *, metrics_port: int = 0,
                     options: Sequence[str] = (), python_options: Sequence[str] = ()
                     ) -> Iterator[subprocess.Popen[bytes]]:
    """The real operator as the kubeconfig's user (the chart's ServiceAccount, for most benchmarks), watching
    `namespace` only (never the pools of tests that run meanwhile), ready (its /readyz answers) when this
    yields. `options` go to the operator, `python_options` to its interpreter (`-m cProfile ...`)."""
    health = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    with log_path.open("w") as log:
        op = subprocess.Popen([sys.executable, *python_options, "-m", "pdfleet.operator", "--kubeconfig",
                               str(kubeconfig), "--metrics-port", str(metrics_port or free_port()),
                               "--health-port", str(health), "--bind-address", "127.0.0.1", "--log-format", "json",
                               "--namespace", namespace, *options],
                              stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            def ready() -> bool:
                if op.poll() is not None:
                    raise SystemExit(f"the operator exited with {op.returncode}; its log: {log_path}")
                with contextlib.suppress(OSError), \
                        urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as r:
                    return r.status == 200
                return False
            wait_for("the operator to be ready", ready, timeout=60)
            yield op
        finally:
            if op.poll() is None:
                op.send_signal(signal.SIGTERM)
                try:
                    op.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    op.kill()
                    op.wait()


class Api:
    """Reads from the apiserver over one kept-alive HTTPS connection, as the kubeconfig's admin."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
        tls.load_cert_chain(user["client-certificate"], user["client-key"])
        self._http = httpx.Client(base_url=cluster["server"], verify=tls, timeout=10)

    def close(self) -> None:
        self._http.close()

    def get(self, path: str, **params: str) -> Body:
        response = self._http.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def pool(self, namespace: str, name: str) -> Body:
        return self.get(f"{POOLS.format(namespace=namespace)}/{name}")

    def pods(self, namespace: str, selector: str) -> list[Body]:
        return self.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector)["items"]

    def pod(self, namespace: str, name: str) -> Body | None:
        response = self._http.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return None if response.status_code == 404 else response.raise_for_status().json()


def pool_body(namespace: str, name: str, **sections: Body) -> Body:
    """examples/local-fleet.yaml as pool `name`, each keyword merged into the spec section it names."""
    body = yaml.safe_load((ROOT / "examples" / "local-fleet.yaml").read_text())
    body["metadata"] = {"name": name, "namespace": namespace}
    body["spec"] |= {key: {**body["spec"].get(key, {}), **values} for key, values in sections.items()}
    return body


def apply(body: Body) -> None:
    kubectl("apply", "-f", "-", stdin=json.dumps(body))


def is_ready(pod: Body) -> bool:
    status = pod.get("status") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
    return ready and not pod["metadata"].get("deletionTimestamp")


def engine_selector(pool: str) -> str:
    return f"pdfleet.dev/pool={pool},app.kubernetes.io/component!=router"


def groups(pool: Body) -> dict[str, Body]:
    return {g["name"]: g for g in (pool.get("status") or {}).get("groups") or []}


def delete_namespace(api: Api, namespace: str, *, timeout: float = 120) -> None:
    """Deletes the namespace and waits until its pods are gone, so their processes do not load what runs next."""
    kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)
    with contextlib.suppress(SystemExit):
        wait_for(f"the pods of {namespace} to go", lambda: not api.pods(namespace, ""), timeout=timeout, interval=1)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
