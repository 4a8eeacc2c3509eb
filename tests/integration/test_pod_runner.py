"""pdfleet-sim plays kubelet for pdfleet's pods on the local cluster: real processes on the pods' loopback IPs,
with the pods' own identities, and pod status that tells the truth (exit codes, probes, termination)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import textwrap
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from pdfleet.podrunner.kube import Client, Kubeconfig, Replaced
from tests.support.cluster import Cluster, wait_for
from tests.support.pools import example

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
PART_OF = {"app.kubernetes.io/part-of": "pdfleet"}


@pytest.fixture(autouse=True)
def local_only(cluster: Cluster) -> None:
    if not cluster.is_local:
        pytest.skip("the pod runner runs with the local control plane only")


def pod_dir(cluster: Cluster, namespace: str, name: str) -> Path:
    return cluster.kubeconfig.parent / "pods" / namespace / name


def create_pod(cluster: Cluster, namespace: str, name: str, container: dict[str, Any], **spec: Any) -> None:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": PART_OF},
            "spec": {"containers": [{"name": "main", "image": "local/none:1", **container}], **spec}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(body))


def pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get("pod", name, "-n", namespace)


def waiting(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The first of the pod's containers that waits: its reason and message."""
    statuses = pod(cluster, namespace, name)["status"].get("containerStatuses") or []
    return next((s["state"]["waiting"] for s in statuses if "waiting" in s.get("state", {})), None)


def condition(p: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in p["status"].get("conditions", []) if c["type"] == kind), None)


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def test_a_command_that_exits_3_fails_the_pod_with_its_exit_code_and_log_tail(cluster: Cluster,
                                                                              namespace: str) -> None:
    create_pod(cluster, namespace, "exits", {
        "command": ["python3", "-c", "import sys; print('about to fail: marker-42', flush=True); sys.exit(3)"],
    }, restartPolicy="Never")

    def failed() -> dict | None:
        p = pod(cluster, namespace, "exits")
        return p if p["status"].get("phase") == "Failed" else None

    p = wait_for("the pod to fail", failed, timeout=60)
    terminated = p["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3
    assert terminated["reason"] == "Error"
    assert "about to fail: marker-42" in terminated["message"]
    assert condition(p, "Ready") == "False"
    assert "marker-42" in (pod_dir(cluster, namespace, "exits") / "main.log").read_text()


SERVER = textwrap.dedent("""
    import http.server, os, signal, sys
    def stop(*_):
        print("got SIGTERM", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if os.path.exists("ready") else 503)
            self.end_headers()
        def log_message(self, *a):
            pass
    print("serving", flush=True)
    http.server.HTTPServer((os.environ["PDFLEET_BIND_ADDRESS"], 8080), H).serve_forever()
""")


def test_readiness_follows_the_probe_and_deletion_runs_prestop_then_sigterm(cluster: Cluster,
                                                                            namespace: str) -> None:
    create_pod(cluster, namespace, "web", {
        "command": ["python3", "-c", SERVER],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1, "failureThreshold": 1},
        "lifecycle": {"preStop": {"exec": {"command": ["python3", "-c", "print('prestop ran', flush=True)"]}}},
    }, restartPolicy="Always", terminationGracePeriodSeconds=20)
    directory = pod_dir(cluster, namespace, "web")

    def ready_is(value: str) -> Any:
        return lambda: condition(pod(cluster, namespace, "web"), "Ready") == value

    p = wait_for("the pod to run", lambda: (x := pod(cluster, namespace, "web"))["status"].get(
        "containerStatuses", [{}])[0].get("state", {}).get("running") and x, timeout=60)
    ip = p["status"]["podIP"]
    wait_for("the server to answer on the pod IP", lambda: http_status(f"http://{ip}:8080/") == 503, timeout=30)
    assert condition(pod(cluster, namespace, "web"), "Ready") == "False", "503 from the probe: not Ready"

    (directory / "ready").touch()
    wait_for("Ready=True once the probe passes", ready_is("True"), timeout=30)
    (directory / "ready").unlink()
    wait_for("Ready=False once it fails", ready_is("False"), timeout=30)
    (directory / "ready").touch()
    wait_for("Ready=True again", ready_is("True"), timeout=30)

    cluster.kubectl("delete", "pod", "web", "-n", namespace, "--wait=false")
    wait_for("the pod object to disappear",
             lambda: cluster.kubectl("get", "pod", "web", "-n", namespace, check=False).returncode != 0, timeout=30)
    log = (directory / "main.log").read_text()
    assert log.index("prestop ran") < log.index("got SIGTERM"), log
    assert http_status(f"http://{ip}:8080/") == 0, "the process is gone"


def test_a_router_pod_runs_the_real_router_as_its_service_account(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "router", "-n", namespace)
    cluster.kubectl("create", "role", "router", "-n", namespace, "--verb=get,list,watch", "--resource=pods")
    # No RoleBinding: the router must be denied, proving it runs with its own token, not the admin's.
    args = ["--pd-disaggregation", "--host", "0.0.0.0", "--port", "8000", "--service-discovery",
            "--service-discovery-namespace", namespace, "--service-discovery-port", "30000",
            "--prefill-selector", "pdfleet.dev/role=prefill", "--decode-selector", "pdfleet.dev/role=decode",
            "--prometheus-host", "0.0.0.0", "--prometheus-port", "29000"]
    create_pod(cluster, namespace, "router", {
        "command": ["python3", "-m", "sglang_router.launch_router"], "args": args,
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, "periodSeconds": 2},
    }, serviceAccountName="router")

    ip = wait_for("a pod IP", lambda: pod(cluster, namespace, "router")["status"].get("podIP"), timeout=60)
    wait_for("the router to answer on its pod IP", lambda: http_status(f"http://{ip}:8000/liveness") == 200,
             timeout=60)
    assert http_status(f"http://{ip}:8000/readiness") == 503, "no workers yet"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", 8000)) != 0, "it listens on the pod IP, not on 0.0.0.0"
    p = pod(cluster, namespace, "router")
    assert p["status"]["phase"] == "Running"
    assert condition(p, "Ready") == "False"

    directory = pod_dir(cluster, namespace, "router")
    kubeconfig = directory / "kubeconfig"
    assert kubeconfig.stat().st_mode & 0o777 == 0o600
    whoami = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json"],
                            capture_output=True, text=True, env=cluster.env, check=True)
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:router"
    wait_for("the router's pod watch to be forbidden", lambda: any(
        word in (directory / "main.log").read_text() for word in ("403", "forbidden", "Forbidden")), timeout=60)


def test_the_charts_operator_runs_as_a_real_process_and_reconciles_a_pool(cluster: Cluster, namespace: str) -> None:
    release = f"sim-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    cluster.helm("install", release, str(ROOT / "charts" / "pdfleet"), "--namespace", namespace,
                 "--set", "operator.enabled=true", "--set", f"watchNamespaces={{{namespace}}}",
                 "--set", "metrics.service.enabled=false")
    try:
        selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"

        def operator_ready() -> dict | None:
            pods = cluster.get("pods", "-n", namespace, "-l", selector)["items"]
            return pods[0] if pods and condition(pods[0], "Ready") == "True" else None

        op = wait_for("the operator pod to be Ready", operator_ready, timeout=90)
        log = (pod_dir(cluster, namespace, op["metadata"]["name"]) / "operator.log").read_text()
        assert "Traceback" not in log, log[-3000:]

        body = example("minimal")
        body["metadata"] = {"name": "tiny", "namespace": namespace}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
        status = wait_for("the operator to write the pool's status", lambda: cluster.get(
            "pdpool", "tiny", "-n", namespace).get("status", {}).get("phase"), timeout=60)
        # Any phase proves a reconcile (Pending too: other tests' pods may hold the GPUs); the engine pods it
        # created prove its ServiceAccount may write what the chart's RBAC grants.
        assert status in ("Pending", "Progressing", "Ready", "Degraded"), status
        wait_for("the pool's engine pods", lambda: cluster.get(
            "pods", "-n", namespace, "-l", "pdfleet.dev/pool=tiny,pdfleet.dev/role")["items"], timeout=60)
    finally:
        cluster.kubectl("delete", "pdpool", "--all", "-n", namespace, "--wait=false", check=False)
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)


def test_a_status_about_a_deleted_pod_never_lands_on_a_new_pod_of_its_name(cluster: Cluster, namespace: str) -> None:
    # The race this guards: kwok's fallback deletes a played pod at the end of its grace period while the
    # runner still writes the old pod's final status (Failed, exit 137); the operator has already created the
    # group's pod again under the same name. Before the guard, the new pod read Failed and was restarted again.
    unplayed = {"nodeSelector": {"pdfleet.dev/no-such-node": "x"}}  # never scheduled: nobody else writes it
    create_pod(cluster, namespace, "same-name", {"command": ["true"]}, **unplayed)
    old_uid = pod(cluster, namespace, "same-name")["metadata"]["uid"]
    cluster.kubectl("delete", "pod", "same-name", "-n", namespace, "--grace-period=0", "--force", "--wait=true")
    create_pod(cluster, namespace, "same-name", {"command": ["true"]}, **unplayed)
    new_uid = pod(cluster, namespace, "same-name")["metadata"]["uid"]
    assert new_uid != old_uid

    async def write(uid: str) -> None:
        client = Client(Kubeconfig(cluster.kubeconfig))
        try:
            await client.patch_pod_status(namespace, "same-name", uid, {"status": {"message": f"from {uid}"}})
        finally:
            await client.close()

    with pytest.raises(Replaced):
        asyncio.run(write(old_uid))
    assert pod(cluster, namespace, "same-name")["status"].get("message") is None
    asyncio.run(write(new_uid))
    assert pod(cluster, namespace, "same-name")["status"]["message"] == f"from {new_uid}"


def test_a_pod_waiting_for_a_secret_key_says_so_and_starts_once_the_secret_exists(cluster: Cluster,
                                                                                   namespace: str) -> None:
    create_pod(cluster, namespace, "waits", {
        "command": ["python3", "-c", "import os; print('token is', os.environ['TOKEN'], flush=True)"],
        "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "later", "key": "token"}}}],
    }, restartPolicy="Never")

    state = wait_for("the container to wait for its Secret", lambda: waiting(cluster, namespace, "waits"), timeout=60)
    assert state["reason"] == "CreateContainerConfigError"
    assert state["message"].endswith('secret "later" not found'), state  # kubelet's words

    cluster.kubectl("create", "secret", "generic", "later", "-n", namespace, "--from-literal=token=t0k3n")
    wait_for("the pod to run to completion", lambda: pod(cluster, namespace, "waits")["status"].get("phase") ==
             "Succeeded", timeout=60)
    assert "token is t0k3n" in (pod_dir(cluster, namespace, "waits") / "main.log").read_text()


def test_a_pod_waiting_for_a_config_map_key_says_so_and_starts_once_the_key_exists(cluster: Cluster,
                                                                                    namespace: str) -> None:
    cluster.kubectl("create", "configmap", "settings", "-n", namespace, "--from-literal=other=x")
    create_pod(cluster, namespace, "waits-cm", {
        "command": ["python3", "-c", "import os; print('level', os.environ['LEVEL'], 'opt' in os.environ, flush=True)"],
        "env": [{"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}}},
                {"name": "opt", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k", "optional": True}}}],
    }, restartPolicy="Never")

    state = wait_for("the container to wait for its ConfigMap key", lambda: waiting(cluster, namespace, "waits-cm"),
                     timeout=60)
    assert state["reason"] == "CreateContainerConfigError"
    assert state["message"].endswith(f"couldn't find key level in ConfigMap {namespace}/settings"), state

    cluster.kubectl("patch", "configmap", "settings", "-n", namespace, "--type=merge", "-p", '{"data":{"level":"3"}}')
    wait_for("the pod to run to completion", lambda: pod(cluster, namespace, "waits-cm")["status"].get("phase") ==
             "Succeeded", timeout=60)
    assert "level 3 False" in (pod_dir(cluster, namespace, "waits-cm") / "main.log").read_text()
