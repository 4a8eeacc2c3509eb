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


def test_the_readme_walkthrough_runs_as_written(cluster: Cluster, ran: subprocess.CompletedProcess[str]) -> None:
    assert ran.returncode == 0, f"the README walkthrough failed:\n{ran.stderr[-6000:]}\n{ran.stdout[-3000:]}"
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
