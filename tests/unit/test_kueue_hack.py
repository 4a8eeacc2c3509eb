"""hack/kueue.py and the Kueue part of hack/build-binaries.sh, without a cluster: what is missing is named with
the command that builds it, and only pods that ask for a queue ever reach Kueue's webhooks."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def kueue_module(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """hack/kueue.py loaded afresh under `env` (localcluster reads its paths at import)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(ROOT / "hack"))
    for name in ("kueue", "localcluster"):
        sys.modules.pop(name, None)
    spec = importlib.util.spec_from_file_location("kueue", ROOT / "hack" / "kueue.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_up_without_the_binary_names_the_command_that_builds_it(tmp_path: Path) -> None:
    env = os.environ | {"PDFLEET_CACHE": str(tmp_path / "cache"), "PDFLEET_CLUSTER_DIR": str(tmp_path / "cluster")}
    env.pop("PDFLEET_KUBECONFIG", None)
    env.pop("PDFLEET_BIN", None)
    result = subprocess.run([sys.executable, str(ROOT / "hack" / "kueue.py"), "up"], env=env, text=True,
                            capture_output=True, timeout=60)
    assert result.returncode == 1
    assert "hack/build-binaries.sh kueue" in result.stderr
    assert "Traceback" not in result.stderr


def test_cached_kueue_is_not_rebuilt(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "bin").mkdir(parents=True)
    (cache / "bin" / "kueue").write_text("#!/bin/sh\n")
    (cache / "bin" / "kueue").chmod(0o755)
    (cache / "bin" / ".kueue.version").write_text("v9.9.9\n")
    (cache / "kueue-v9.9.9" / "webhook").mkdir(parents=True)
    (cache / "kueue-v9.9.9" / "webhook" / "manifests.yaml").write_text("")
    env = os.environ | {"PDFLEET_CACHE": str(cache), "GOPROXY": "off", "KUEUE_VERSION": "v9.9.9"}
    result = subprocess.run(["bash", str(ROOT / "hack" / "build-binaries.sh"), "kueue"], env=env, text=True,
                            capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "kueue v9.9.9: cached" in result.stderr


WEBHOOKS = """\
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mdeployment.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-apps-v1-deployment}}
  rules: [{apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}]
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  failurePolicy: Fail
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
- name: mclusterqueue.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-kueue-x-k8s-io-v1beta2-clusterqueue}}
  rules: [{apiGroups: [kueue.x-k8s.io], apiVersions: [v1beta2], operations: [CREATE], resources: [clusterqueues]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: validating-webhook-configuration}
webhooks:
- name: vjob.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate-batch-v1-job}}
  rules: [{apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}]
"""


def test_only_pods_that_ask_for_a_queue_reach_kueue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    (cache / "kueue-v9.9.9" / "webhook").mkdir(parents=True)
    (cache / "kueue-v9.9.9" / "webhook" / "manifests.yaml").write_text(WEBHOOKS)
    (tmp_path / "cluster" / "pki").mkdir(parents=True)
    (tmp_path / "cluster" / "pki" / "ca.crt").write_text("not a real CA\n")
    kq = kueue_module({"PDFLEET_CACHE": str(cache), "PDFLEET_CLUSTER_DIR": str(tmp_path / "cluster"),
                       "KUEUE_VERSION": "v9.9.9", "PDFLEET_KUEUE_WEBHOOK_PORT": "20999"}, monkeypatch)
    configs = {c["kind"]: c for c in kq.webhook_configurations()}
    mutating = configs["MutatingWebhookConfiguration"]
    assert mutating["metadata"]["name"] == "pdfleet-kueue-mutating"
    assert [h["name"] for h in mutating["webhooks"]] == ["mpod.kb.io", "mclusterqueue.kb.io"], \
        "Deployments, Jobs and the like never go through Kueue here"
    assert configs["ValidatingWebhookConfiguration"]["webhooks"] == []
    pod, queue = mutating["webhooks"]
    assert pod["objectSelector"] == {"matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]}
    assert "objectSelector" not in queue
    assert pod["clientConfig"]["url"] == "https://127.0.0.1:20999/mutate--v1-pod"
    assert "service" not in pod["clientConfig"] and pod["clientConfig"]["caBundle"]
