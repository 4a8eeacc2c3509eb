"""Fixtures shared by every tier: a real cluster and a fresh namespace per test."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import scheduling
from tests.support.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
LOCALCLUSTER = ROOT / "hack" / "localcluster.py"
RUN_ID = "PDFLEET_TEST_RUN"
# Names the run whose test started the local cluster, which its first process stops at the end.
STARTED_BY = Path(tempfile.gettempdir()) / "pdfleet-cluster-started-by-test-run"


# Tests talk only to 127.0.0.0/8. A proxy in the environment would carry that traffic elsewhere (httpx, aiohttp
# and the openai client honour these by default), so no test, and no process a test starts, sees one.
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(RUN_ID, uuid.uuid4().hex)  # set before pytest-xdist starts its workers: they inherit it
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
        why = scheduling.misplaced(item.nodeid, set(getattr(item, "fixturenames", ())),
                                   item.get_closest_marker("cluster") is not None, scheduling.unit_of(item.nodeid))
        if why:
            raise pytest.UsageError(why)
    items[:] = scheduling.disruptive_last(items, [i.get_closest_marker("disruptive") is not None for i in items])
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    reason = _missing_gpu()
    if reason is not None:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`pytest -n N --dist loadscope`, what `make test` runs: the units of work of tests/support/scheduling.py.
    Other `--dist` modes are pytest-xdist's own."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scheduling.unit_of(nodeid)

    return Units(config, log)


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
def cluster() -> Cluster:
    """A running cluster: the one PDFLEET_KUBECONFIG names, the local control plane if it is already up, or
    a local control plane started here (and stopped again at the end of the run, by the process that started
    the run: pytest-xdist's workers share it)."""
    with _startup_lock():
        status = None if os.environ.get("PDFLEET_KUBECONFIG") else _localcluster("status")
        up = _localcluster("up")
        # The run owns the cluster (and stops it at its end) only if nothing of it ran before and its `up`
        # worked: a run that found part of a cluster running, or failed to start one, leaves it to whoever runs it.
        if status is not None and status.returncode != 0 and " running " not in status.stdout + status.stderr \
                and up.returncode == 0:
            STARTED_BY.write_text(os.environ[RUN_ID])
    if up.returncode != 0:
        pytest.fail(f"could not bring up the local cluster:\n{up.stderr}", pytrace=False)
    env = dict(line.removeprefix("export ").split("=", 1) for line in _localcluster("env").stdout.splitlines())
    bin_dir = Path(env["PATH"].split(":", 1)[0])
    return Cluster(kubeconfig=Path(env["KUBECONFIG"]), bin_dir=bin_dir,
                   is_local=not os.environ.get("PDFLEET_KUBECONFIG"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the process that started the run (not a pytest-xdist worker): stops the local cluster if a test of
    this run started it."""
    if hasattr(session.config, "workerinput") or os.environ.get("PDFLEET_KEEP_CLUSTER"):
        return
    with contextlib.suppress(FileNotFoundError):
        if STARTED_BY.read_text() == os.environ.get(RUN_ID):
            STARTED_BY.unlink()
            _localcluster("down")


@contextlib.contextmanager
def _startup_lock() -> Iterator[None]:
    with (Path(tempfile.gettempdir()) / "pdfleet-cluster-startup.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting for it to drain). A test on the shared
    operator gets one that operator watches; no other test does (tests/support/scheduling.py)."""
    shared = "operator" in request.fixturenames
    prefix = scheduling.shared_operator(scheduling.module_path(request.module.__file__)).prefix if shared else "t-"
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pdfleet.dev/test=true")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
