"""Fixtures of the end-to-end tests: the chart installed by real helm and the operator running with the chart's
ServiceAccount token, one operator process per test module."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import cluster_share as cluster_share_mod
from tests.support import kueue as kueue_support
from tests.support import private_cluster as private_cluster_mod
from tests.support import release_users, scheduling
from tests.support.cluster import Cluster
from tests.support.operator_process import OperatorProcess, running_operator, token_kubeconfig
from tests.support.release import RELEASE_NAMESPACE

ROOT = Path(__file__).resolve().parents[2]
ALLOW_ANY = {"hostPathPrefixes": ["*"], "priorityClasses": ["*"], "tolerationKeys": ["*"], "imagePrefixes": ["*"]}


@pytest.fixture(autouse=True)
def cluster_share(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[None]:
    """The shared cluster, held alone by a test marked disruptive and shared by any other."""
    disruptive = request.node.get_closest_marker("disruptive") is not None
    with cluster_share_mod.hold(cluster.kubeconfig, exclusive=disruptive):
        yield


@pytest.fixture(scope="module")
def chart(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[None]:
    """The chart without the in-cluster operator Deployment: CRD, ServiceAccount and RBAC only, as the release
    of the module's shared operator (tests/support/scheduling.py)."""
    release = scheduling.shared_operator(scheduling.module_path(request.module.__file__)).release

    def install() -> None:
        # helm installs a chart's CRDs only once and never upgrades them: a long-lived cluster needs them applied.
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        # The release is cluster-wide, so its pool-policy admission would hold every test's namespace to one
        # policy: it allows anything here, and each operator holds its own namespaces to its flags (the defaults,
        # below). tests/integration/test_pool_policy.py binds policies of its own to its namespace.
        cluster.helm("upgrade", "--install", release, str(ROOT / "charts" / "pdfleet"), "--namespace",
                     RELEASE_NAMESPACE, "--create-namespace", "--set", "operator.enabled=false",
                     "--set-json", f"poolPolicy={json.dumps(ALLOW_ANY)}", "--wait")

    # Uninstalled by the last module that uses it: another run's module on the same release keeps its token.
    with release_users.using(cluster.kubeconfig, release, install=install, uninstall=lambda: cluster.helm(
            "uninstall", release, "--namespace", RELEASE_NAMESPACE, check=False)):
        cluster.wait_established("inferencepools.pdfleet.dev")
        yield


@pytest.fixture(scope="module")
def operator(cluster: Cluster, chart: None, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    shared = scheduling.shared_operator(scheduling.module_path(request.module.__file__))
    tmp = tmp_path_factory.mktemp("operator")
    with contextlib.ExitStack() as stack:
        # Started while holding the cluster shared, as a test does: a disruptive test (it restarts the apiserver)
        # once did so while this operator was starting, and kopf, told by the restarting apiserver that none of
        # its kinds was served, never watched them (it rediscovers only when a CRD changes). The hold ends once
        # the operator is ready, which it is only once kopf watches every kind it handles (kopf_watch.py).
        with cluster_share_mod.hold(cluster.kubeconfig, exclusive=False):
            kubeconfig = token_kubeconfig(cluster, RELEASE_NAMESPACE, shared.release, tmp / "kubeconfig")
            # Only the namespaces of the tests on it: the other cluster tests run alongside
            # (tests/support/scheduling.py).
            op = stack.enter_context(running_operator(kubeconfig, tmp / "operator.log", "--resync-period", "1",
                                                      "--namespace", shared.namespaces,
                                                      f"--allow-toleration-key={kueue_support.NODES_LABEL}"))
        yield op
        assert "Traceback" not in op.logs(), op.logs()[-5000:]
        # An RBAC denial reads: ... is forbidden: User "system:serviceaccount:..." cannot <verb> resource ...
        user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{shared.release}"
        forbidden = [r for r in op.log_records() if f'User "{user}" cannot' in json.dumps(r)]
        assert forbidden == [], f"the chart's RBAC is missing a permission: {forbidden[:3]}"


@pytest.fixture(scope="session")
def kueue(cluster: Cluster) -> None:
    """Kueue running against the cluster: `make cluster-up` starts it; a local cluster brought up without it gets
    it started here, and the run that started it stops it at its end (`pytest_sessionfinish`)."""
    kueue_support.ensure_running(cluster)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the process that started the run (not a pytest-xdist worker), once every worker is done."""
    if not hasattr(session.config, "workerinput"):
        kueue_support.stop_if_started_by_this_run()


@pytest.fixture
def private_cluster(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A private control plane's directory and the environment that names it (tests/support/private_cluster.py),
    not brought up: the test does; brought down at the end whatever happened."""
    cluster_dir = tmp_path / "cluster"
    env = private_cluster_mod.environment(cluster_dir)
    yield cluster_dir, env
    private_cluster_mod.localcluster(env, "down")
