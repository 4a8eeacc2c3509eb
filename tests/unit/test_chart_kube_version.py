"""Plain `helm template charts/pdfleet` works offline; a render against a cluster older than 1.29 is refused.

Against a cluster (install, upgrade, `--dry-run=server`), Helm's capabilities list the CRD's API version and
the cluster's real Kubernetes version: `--api-versions` and `--kube-version` stand in for that here.
"""

from __future__ import annotations

import pytest

from tests.unit.test_chart import CHART, documents, helm, of_kind

CLUSTER_KNOWS_THE_CRD = ("--api-versions", "pdfleet.dev/v1alpha1")


def test_plain_helm_template_renders_the_operator_with_helms_default_capabilities() -> None:
    rendered = helm("template", str(CHART))
    assert len(of_kind(documents(rendered.stdout), "Deployment")) == 1


def test_plain_strict_lint_passes_with_helms_default_capabilities() -> None:
    assert "0 chart(s) failed" in helm("lint", "--strict", str(CHART)).stdout


@pytest.mark.parametrize("version", ["1.28.9", "1.20.0"])
def test_a_cluster_older_than_1_29_is_refused_naming_its_version(version: str) -> None:
    result = helm("template", str(CHART), *CLUSTER_KNOWS_THE_CRD, "--kube-version", version, check=False)
    assert result.returncode != 0
    assert f"pdfleet needs Kubernetes 1.29 or newer (the InferencePool CRD's validation rules); this cluster " \
           f"runs v{version}" in result.stderr


@pytest.mark.parametrize("version", ["1.29.0", "1.29.0-rc.1", "1.34.4", "1.30.2-gke.1"])
def test_a_cluster_of_1_29_or_newer_renders(version: str) -> None:
    helm("template", str(CHART), *CLUSTER_KNOWS_THE_CRD, "--kube-version", version)
