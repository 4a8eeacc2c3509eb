"""The README's walkthrough on a Kubernetes cluster, run as written on the local cluster's real node: the block the
README marks is taken from the README itself and run by bash, command by command, so the README cannot drift
from what works. What a person would read in its output is then checked: a chat completion, the pool's Events,
the rollout finished; and the operator and the pool in real containers."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import fleet, real_node
from tests.support.cluster import Cluster

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- walkthrough: run by tests/integration/test_readme_walkthrough.py -->"
NAMESPACES = ("demo", "pdfleet")


def walkthrough() -> str:
    text = (ROOT / "README.md").read_text()
    assert MARK in text, f"README.md lost its walkthrough mark {MARK!r}"
    block = re.match(r"\s*```sh\n(.*?)\n```", text.split(MARK, 1)[1], re.S)
    assert block, "the walkthrough mark is not followed by a ```sh block"
    return block.group(1)


def clean(cluster: Cluster) -> None:
    cluster.run("helm", "uninstall", "pdfleet", "-n", "pdfleet", "--wait", check=False)
    cluster.kubectl("delete", "namespace", *NAMESPACES, "--ignore-not-found", "--wait=true", timeout=180)


@pytest.fixture
def ran(cluster: Cluster) -> Iterator[subprocess.CompletedProcess[str]]:
    if not cluster.is_local:
        pytest.skip("the walkthrough runs on the local cluster's real node (PDFLEET_KUBECONFIG names another)")
    clean(cluster)  # a run killed before its clean-up
    # Each command echoed (-x) and the first failure fatal, as a person would stop at it; the backgrounded
    # port-forward ends with the shell's process group.
    script = f"set -euxo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{walkthrough()}\n"
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "PDFLEET_KUBECONFIG")}
    try:
        yield subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, text=True, capture_output=True,
                             timeout=900, start_new_session=True)
    finally:
        clean(cluster)


def cluster_view(cluster: Cluster) -> str:
    """What a person would look at when the walkthrough stops: the pool's conditions and groups, every pod's phase
    and containers' states in both namespaces, and the pool namespace's Events."""
    try:
        return _cluster_view(cluster)
    except Exception as e:  # a walkthrough that stopped before the CRD or the namespaces existed
        return f"(the cluster could not be read: {e})"


def _cluster_view(cluster: Cluster) -> str:
    lines = []
    for item in cluster.get("pdpool", "-n", "demo")["items"]:
        status = item.get("status") or {}
        lines += [f"pool {item['metadata']['name']}: phase {status.get('phase')}"]
        lines += [f"  {c['type']}={c['status']} {c.get('reason')}: {c.get('message')}" for c in status.get(
            "conditions", [])]
        lines += [f"  group {g['name']}: {g.get('phase')} {g.get('verdict')} {g.get('message') or ''}"
                  for g in status.get("groups", [])]
    for namespace in NAMESPACES:
        for pod in cluster.get("pods", "-n", namespace)["items"]:
            states = {c["name"]: next(iter(c.get("state") or {"unknown": {}}))
                      for c in (pod.get("status") or {}).get("containerStatuses") or []}
            lines.append(f"pod {namespace}/{pod['metadata']['name']}: {(pod.get('status') or {}).get('phase')} "
                         f"on {pod['spec'].get('nodeName')}, ready {fleet.is_ready(pod)}, containers {states}")
    return "\n".join([*lines, *fleet.event_lines(cluster, "demo")[-40:]])


def test_the_readme_walkthrough_runs_as_written(cluster: Cluster, ran: subprocess.CompletedProcess[str]) -> None:
    assert ran.returncode == 0, (f"the README walkthrough failed:\n{ran.stderr[-6000:]}\n{ran.stdout[-3000:]}\n"
                                 f"what the cluster shows:\n{cluster_view(cluster)}")
    # The chat completion curl printed
    # (curl prints no newline after it: the next command's output follows on the same line)
    answer, _ = json.JSONDecoder().raw_decode(ran.stdout[ran.stdout.index('{"id"'):])
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"]
    # The pool's Events, as `kubectl get events` printed them
    assert re.search(r"Normal\s+\w+\s+inferencepool/tiny", ran.stdout), ran.stdout[-3000:]
    # Everything ran on the real node, in real containers: the operator and the pool
    for namespace in NAMESPACES:
        pods = cluster.get("pods", "-n", namespace)["items"]
        assert pods and {p["spec"]["nodeName"] for p in pods} == {real_node.NODE}, namespace
    # The rollout the walkthrough patched in finished, the pool serving at the new revision
    status = fleet.pool(cluster, "demo", "tiny")["status"]
    assert status["phase"] == "Ready"
    assert all("--disable-overlap-schedule" in c.get("args", [])
               for p in fleet.engine_pods(cluster, "demo", "tiny") for c in p["spec"]["containers"]
               if c["name"] == "engine")
