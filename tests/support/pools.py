"""InferencePool bodies for tests, built from the examples so tests and docs cannot drift apart."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())


def pool_body(*, name: str = "tiny", namespace: str = "ns", prefill: int = 1, decode: int = 1,
              base: str = "minimal", uid: str = "uid-1", generation: int = 1, **spec_updates: Any) -> dict[str, Any]:
    """A pool as the apiserver would hand it over (uid, generation, resourceVersion set)."""
    body = copy.deepcopy(example(base))
    body["metadata"] = {"name": name, "namespace": namespace, "uid": uid, "generation": generation,
                        "resourceVersion": "1"}
    body["spec"]["prefill"]["replicas"] = prefill
    body["spec"]["decode"]["replicas"] = decode
    for path, value in spec_updates.items():
        node = body["spec"]
        *parents, leaf = path.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return body


# pool_body() updates for tests of a rollout's mechanics, not of its bake and watch: no group of a new revision
# bakes and no revision is watched after its rollout (tests/unit/test_bake.py walks those).
NO_BAKE: dict[str, Any] = {"rollout__verification__bake": "0s", "rollout__postRolloutWatch": "0s"}
