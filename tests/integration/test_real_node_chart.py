"""pdfleet in real containers on the local cluster's real node, as a platform team would run it: the chart,
installed by real helm with the images `make images` built, runs the operator there (pulled by digest, admitted
under Pod Security `restricted`, Ready through its real probes, two replicas with one leading, the Lease handed over
when the leader's pod is deleted), and a pool whose groups land there serves through its router, is drained on a
real SIGTERM, has a killed engine container replaced, and says why when its image does not exist."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import fleet, real_node
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "pdfleet-real"


def pods(cluster: Cluster, namespace: str) -> list[dict]:
    return cluster.get("pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]


def ready(pod: dict) -> bool:
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")


def holder(cluster: Cluster, namespace: str) -> str:
    lease = cluster.kubectl("get", "lease", RELEASE, "-n", namespace, "-o", "json", check=False)
    return json.loads(lease.stdout)["spec"].get("holderIdentity") or "" if lease.returncode == 0 else ""


@pytest.fixture(scope="module")
def release(cluster: Cluster) -> Iterator[tuple[str, str, dict[str, real_node.Pushed]]]:
    """The chart in a namespace that enforces `restricted`, watching one pool namespace of its own (the suite's
    other operators own the rest)."""
    if not cluster.is_local:
        pytest.skip("the real node belongs to the local cluster (PDFLEET_KUBECONFIG names another)")
    images = real_node.push_images("pdfleet-operator", "pdfleet-runtime", "pdfleet-engine-cpu")
    suffix = uuid.uuid4().hex[:8]
    system, pools = f"real-system-{suffix}", f"real-pools-{suffix}"
    for ns, level in ((system, "restricted"), (pools, "baseline")):
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("label", "namespace", ns, f"pod-security.kubernetes.io/enforce={level}",
                        f"pod-security.kubernetes.io/warn={level}")
    values = {
        "image": {"digest": images["pdfleet-operator"].digest},
        "runtime": {"image": {"digest": images["pdfleet-runtime"].digest}},
        "watchNamespaces": [pools],
        "nodeSelector": real_node.NODE_SELECTOR, "tolerations": real_node.TOLERATIONS,
        # The pool's pods tolerate the node's taint too, which the pool policy must allow.
        "poolPolicy": {"tolerationKeys": [t["key"] for t in real_node.TOLERATIONS]},
    }
    try:
        cluster.run("helm", "install", RELEASE, str(ROOT / "charts" / "pdfleet"), "--namespace", system,
                    "--values", "-", "--wait", "--timeout", "180s", input=json.dumps(values), timeout=240)
        yield system, pools, images
    finally:
        cluster.helm("uninstall", RELEASE, "--namespace", system, "--wait", check=False)
        cluster.kubectl("delete", "namespace", system, pools, "--wait=false", check=False)


def test_the_operator_runs_in_real_containers_pulled_by_digest_under_restricted(
        cluster: Cluster, release: tuple[str, str, dict[str, real_node.Pushed]]) -> None:
    system, _, images = release
    running = wait_for("two operator pods Ready", lambda: (
        p if len(p := [x for x in pods(cluster, system) if ready(x)]) == 2 else None), timeout=120)
    for pod in running:
        assert pod["spec"]["nodeName"] == real_node.NODE
        status = pod["status"]["containerStatuses"][0]
        assert status["containerID"].startswith("containerd://")
        # The image the kubelet pulled is the one `make images` built, by digest
        assert pod["spec"]["containers"][0]["image"] == images["pdfleet-operator"].pinned
        assert status["imageID"].endswith(images["pdfleet-operator"].digest)
        assert f"--runtime-image={images['pdfleet-runtime'].pinned}" in pod["spec"]["containers"][0]["args"]
    namespace = cluster.get("namespace", system)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    leader = wait_for("a leader", lambda: holder(cluster, system) or None, timeout=60)
    assert leader.split("_")[0] in {p["metadata"]["name"] for p in running}


def test_deleting_the_leader_s_pod_hands_the_lease_over(
        cluster: Cluster, release: tuple[str, str, dict[str, real_node.Pushed]]) -> None:
    """The leader releases the Lease as it stops on the kubelet's SIGTERM; whichever replica asks first then takes it:
    the standby on its next retry, or the Deployment's replacement pod, which starts in a second or two with its
    image on the node (both were seen)."""
    system, _, _ = release
    wait_for("two operator pods Ready", lambda: len([p for p in pods(cluster, system) if ready(p)]) == 2 or None,
             timeout=120)
    leader = wait_for("a leader", lambda: holder(cluster, system) or None, timeout=60)
    leader_pod = next(p["metadata"]["name"] for p in pods(cluster, system) if leader.startswith(p["metadata"]["name"]))
    cluster.kubectl("delete", "pod", leader_pod, "-n", system, "--wait=false")
    new = wait_for("another replica holding the Lease", lambda: (
        h if (h := holder(cluster, system)) and not h.startswith(leader_pod) else None), timeout=60)
    wait_for("two operator pods Ready again, the new leader one of them", lambda: (
        live if len(live := [p["metadata"]["name"] for p in pods(cluster, system)
                             if ready(p) and p["metadata"]["name"] != leader_pod]) == 2
        and any(new.startswith(name) for name in live) else None), timeout=120)


# ------------------------------------------------------------------------------------------------- a pool

POOL = "real"
MODEL = "qwen2.5-0.5b-instruct"


def pool_body(name: str, image: str, *, router: int = 1) -> dict:
    placed = {"nodeSelector": real_node.NODE_SELECTOR, "tolerations": real_node.TOLERATIONS}
    group = {"replicas": 1, "tp": 1, "gpusPerNode": 1, "scheduling": placed}
    return {"apiVersion": "pdfleet.dev/v1alpha1", "kind": "InferencePool", "metadata": {"name": name}, "spec": {
        "model": {"servedName": MODEL, "source": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}},
        "engine": {"image": image, "sglangVersion": "0.5.23"},
        "prefill": group, "decode": group, "router": {"replicas": router, "scheduling": placed},
        "transfer": {"backend": "fake"},
        # The node has 4 (fake) GPUs and 2 cores: no surge groups, and a restart at once
        "rollout": {"maxSurge": {"prefill": 0, "decode": 0}},
    }}


@pytest.fixture(scope="module")
def pool(cluster: Cluster, release: tuple[str, str, dict[str, real_node.Pushed]]) -> str:
    _, namespace, images = release
    body = pool_body(POOL, images["pdfleet-engine-cpu"].pinned)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
    fleet.wait_ready(cluster, namespace, POOL, timeout=240)
    return namespace


@pytest.fixture
def router_port(cluster: Cluster, pool: str) -> Iterator[int]:
    """The pool's router Service reached as a person would: `kubectl port-forward` (apiserver, kubelet, the pod's
    network namespace), on a local port kubectl picks."""
    proc = subprocess.Popen(["kubectl", "port-forward", "-n", pool, f"svc/{POOL}-router", ":30000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert found, f"kubectl port-forward said: {line}"
        yield int(found.group(1))
    finally:
        proc.terminate()
        proc.wait(10)


def http_post(url: str, body: dict, timeout: float) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def live(pods: list[dict]) -> list[dict]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def generate(port: int) -> dict:
    code, body = http_post(f"http://127.0.0.1:{port}/generate",
                           {"text": "hello", "sampling_params": {"max_new_tokens": 4}}, timeout=30)
    assert code == 200, body
    return json.loads(body)


def test_a_pool_on_the_real_node_serves_chat_and_generate_through_its_router(
        cluster: Cluster, pool: str, router_port: int) -> None:
    pods = fleet.engine_pods(cluster, pool, POOL) + fleet.router_pods(cluster, pool, POOL)
    assert len(pods) == 3 and {p["spec"]["nodeName"] for p in pods} == {real_node.NODE}
    for engine in fleet.engine_pods(cluster, pool, POOL):
        # The runtime init container copied pdfleet's runtime and ended; the engine started SGLang's parser
        # with the patches verified against the SGLang in its image
        (init,) = engine["status"]["initContainerStatuses"]
        assert init["state"]["terminated"]["exitCode"] == 0
        log = cluster.kubectl("logs", "-n", pool, engine["metadata"]["name"], "-c", "engine").stdout
        assert re.search(r"pdfleet-engine: SGLang 0\.5\.23; patches: \S", log), log[-2000:]
    for group in fleet.pool(cluster, pool, POOL)["status"]["groups"]:
        assert group["verdict"] == "Healthy", group
    assert generate(router_port)["meta_info"]["completion_tokens"] == 4
    code, body = http_post(f"http://127.0.0.1:{router_port}/v1/chat/completions",
                           {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
                           timeout=30)
    assert code == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"]


def test_an_engine_pod_deleted_drains_on_a_real_sigterm_and_its_group_comes_back(
        cluster: Cluster, pool: str) -> None:
    (prefill,) = fleet.engine_pods(cluster, pool, POOL, role="prefill")
    name, uid = prefill["metadata"]["name"], prefill["metadata"]["uid"]
    # Followed from before the deletion until the container ends: what the kubelet's preStop hook did is there
    follow = subprocess.Popen(["kubectl", "logs", "-f", "-n", pool, name, "-c", "engine", "--since=1s"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env)
    cluster.kubectl("delete", "pod", "-n", pool, name, "--wait=false")
    out, _ = follow.communicate(timeout=120)
    assert "pdfleet-drain: draining the engine" in out, out[-2000:]
    assert re.search(r"pdfleet-drain: .* after \d+\.\d s", out), out[-2000:]
    wait_for("the prefill group back and the pool Ready", lambda: (
        (p := live(fleet.engine_pods(cluster, pool, POOL, role="prefill")))
        and p[0]["metadata"]["uid"] != uid and fleet.phase(cluster, pool, POOL) == "Ready") or None, timeout=240)


def test_an_engine_container_killed_is_seen_and_its_group_replaced(cluster: Cluster, pool: str) -> None:
    (decode,) = fleet.engine_pods(cluster, pool, POOL, role="decode")
    container = next(c for c in decode["status"]["containerStatuses"] if c["name"] == "engine")
    # SIGKILL through the node's runc, as an OOM kill or a crash would end it: no preStop, no goodbye
    real_node.kill_container(container["containerID"])
    said = wait_for("the group restarted as a unit", lambda: [
        e for e in fleet.events(cluster, pool, POOL, "GroupRestarted") if f"{POOL}-decode-0" in e["message"]],
        timeout=120)
    assert "exit code 137" in said[0]["message"], said[0]["message"]
    wait_for("the decode group replaced and the pool Ready", lambda: (
        (p := live(fleet.engine_pods(cluster, pool, POOL, role="decode")))
        and p[0]["metadata"]["uid"] != decode["metadata"]["uid"] and fleet.is_ready(p[0])
        and fleet.phase(cluster, pool, POOL) == "Ready") or None, timeout=240)


def test_a_pool_naming_an_image_that_does_not_exist_says_which_container_waits_and_why(
        cluster: Cluster, pool: str) -> None:
    bad = "missing"
    body = pool_body(bad, "ghcr.io/pdfleet/does-not-exist:1", router=0)
    cluster.kubectl("apply", "-n", pool, "-f", "-", input=json.dumps(body))
    try:
        def waiting() -> list[dict] | None:
            groups = fleet.pool(cluster, pool, bad).get("status", {}).get("groups", [])
            ok = len(groups) == 2 and all("waiting for an image" in (g.get("message") or "") for g in groups)
            return groups if ok else None

        groups = wait_for("both groups saying they wait for their image", waiting, timeout=120)
        for group in groups:
            assert "container engine of pod" in group["message"]
            assert "ghcr.io/pdfleet/does-not-exist:1" in group["message"]
            assert re.search(r"ErrImagePull|ImagePullBackOff", group["message"]), group["message"]
        # Past the kubelet's first back-off, one Warning per group all the same
        wait_for("an ImagePullBackOff", lambda: any(
            "ImagePullBackOff" in (g.get("message") or "")
            for g in fleet.pool(cluster, pool, bad)["status"]["groups"]) or None, timeout=120)
        warnings = fleet.events(cluster, pool, bad, "ImagePullFailed")
        assert sorted(e["message"].split()[1] for e in warnings) == [f"{bad}-decode-0", f"{bad}-prefill-0"]
        assert all(e["type"] == "Warning" and e.get("count", 1) == 1 for e in warnings)
        # Nothing else disturbed: the good pool still Ready
        assert fleet.phase(cluster, pool, POOL) == "Ready"
    finally:
        cluster.kubectl("delete", "pdpool", bad, "-n", pool, "--wait=true", timeout=120)
