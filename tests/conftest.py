"""Fixtures shared by every tier: a real cluster and a fresh namespace per test."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
LOCALCLUSTER = ROOT / "hack" / "localcluster.py"
CLUSTER_TIER = "tests/integration/"  # the tests on the shared cluster, and only they (`misplaced`)


# Tests talk only to 127.0.0.0/8. A proxy in the environment would carry that traffic elsewhere (httpx, aiohttp
# and the openai client honour these by default), so no test, and no process a test starts, sees one.
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def pytest_configure(config: pytest.Config) -> None:
    for name in PROXY_VARIABLES:
        os.environ.pop(name, None)
    # Registered here rather than in pyproject.toml: tests/unit/test_api_field_effects.py reads these markers.
    config.addinivalue_line(
        "markers", "effect(*fields): shows the effect of these InferencePool spec fields (wire paths; `*` is one "
                   "segment), see tests/unit/test_api_field_effects.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuses a test outside its tier (see `misplaced`), and skips the tests marked gpu where no NVIDIA GPU is
    visible, saying what is missing."""
    for item in items:
        why = misplaced(item.nodeid, "cluster" in getattr(item, "fixturenames", ()),
                        item.get_closest_marker("cluster") is not None)
        if why:
            raise pytest.UsageError(why)
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    reason = _missing_gpu()
    if reason is not None:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`pytest -n N --dist loadscope` (what `make test` runs): the tests on the shared cluster (tests/integration/)
    run in one worker, in order, since their module-scoped operators each watch every namespace and one test
    restarts the apiserver; every other module runs whole in some worker, so its module-scoped fixtures are set
    up once. Other `--dist` modes are pytest-xdist's own."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ClusterTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return ClusterTogether(config, log)


def misplaced(nodeid: str, uses_cluster: bool, marked_cluster: bool) -> str | None:
    """What `make test`'s split over workers needs of a test: on the cluster exactly when in the cluster tier."""
    if nodeid.startswith(CLUSTER_TIER) and not marked_cluster:
        return f"{nodeid} is in {CLUSTER_TIER} but not marked cluster (pytestmark = pytest.mark.cluster)"
    if not nodeid.startswith(CLUSTER_TIER) and (uses_cluster or marked_cluster):
        return (f"{nodeid} uses the shared cluster: move it to {CLUSTER_TIER}, whose tests run in one worker in "
                "order (tests/conftest.py, pytest_xdist_make_scheduler)")
    return None


def xdist_scope(nodeid: str) -> str:
    """The unit of work a test belongs to: the whole cluster tier, or its module."""
    return CLUSTER_TIER if nodeid.startswith(CLUSTER_TIER) else nodeid.split("::", 1)[0]


def _missing_gpu() -> str | None:
    # Imported here, not at the top: most runs collect no gpu test and must not pay for importing torch.
    try:
        import torch
    except ModuleNotFoundError:
        return None  # not a skip: the test module's own requires.installed("torch") fails and says how to install it
    if torch.cuda.is_available():
        return None
    build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    hidden = " (CUDA_VISIBLE_DEVICES is empty)" if os.environ.get("CUDA_VISIBLE_DEVICES") == "" else ""
    return f"needs an NVIDIA GPU: torch {torch.__version__} ({build}) sees no CUDA device{hidden}"


def _localcluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(LOCALCLUSTER), *args], text=True, capture_output=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A running cluster: the one PDFLEET_KUBECONFIG names, the local control plane if it is already up, or
    a local control plane started here (and stopped again at the end of the session)."""
    started_here = not os.environ.get("PDFLEET_KUBECONFIG") and _localcluster("status").returncode != 0
    up = _localcluster("up")
    if up.returncode != 0:
        pytest.fail(f"could not bring up the local cluster:\n{up.stderr}", pytrace=False)
    env = dict(line.removeprefix("export ").split("=", 1) for line in _localcluster("env").stdout.splitlines())
    bin_dir = Path(env["PATH"].split(":", 1)[0])
    yield Cluster(kubeconfig=Path(env["KUBECONFIG"]), bin_dir=bin_dir,
                  is_local=not os.environ.get("PDFLEET_KUBECONFIG"))
    if started_here and not os.environ.get("PDFLEET_KEEP_CLUSTER"):
        _localcluster("down")


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting for it to drain)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pdfleet.dev/test=true")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
