"""The images `make images` builds, run with runc as a node would run them: unpacked by umoci into an OCI bundle
from the very archive containerd imports, started as the image's own user.

Building is `make images`' job (a cold build takes minutes: docs/images.md); `make test` runs it first, so here
the build finds everything cached and only checks that it does. Missing tools fail the test with what to install.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.images import build, oci, runc
from pdfleet.operator.render import engine_group

pytestmark = pytest.mark.cluster  # in tests/integration, whose tier holds the cluster; these tests do not use it

ROOT = Path(__file__).resolve().parents[2]
NONROOT = "65532"


@pytest.fixture(scope="module")
def index() -> dict:
    missing = runc.missing_tools(["umoci", "runc", "skopeo"])
    if missing or shutil.which("mmdebstrap") is None:
        pytest.fail(f"make images and this test need the Debian packages mmdebstrap umoci runc skopeo (missing: "
                    f"{' '.join(missing) or 'mmdebstrap'}): apt-get install them, or run `make images` as root",
                    pytrace=False)
    result = subprocess.run([sys.executable, "-m", "hack.images", "build"], cwd=ROOT, capture_output=True, text=True,
                            timeout=3000)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((build.CACHE / "index.json").read_text())


@pytest.fixture(scope="module")
def operator_bundle(index: dict) -> Iterator[runc.Bundle]:
    with runc.unpacked(index["images"]["pdfleet-operator"]["archive"]) as bundle:
        yield bundle


@pytest.fixture(scope="module")
def engine_bundle(index: dict) -> Iterator[runc.Bundle]:
    with runc.unpacked(index["images"]["pdfleet-engine-cpu"]["archive"]) as bundle:
        yield bundle


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result.stdout


def test_a_second_build_builds_nothing_and_says_so(index: dict) -> None:
    result = subprocess.run([sys.executable, "-m", "hack.images", "build"], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert "nothing built" in result.stdout
    assert json.loads((build.CACHE / "index.json").read_text())["images"] == index["images"]
    for name, entry in index["images"].items():
        assert entry["digest"] in result.stdout or entry["digest"][:19] in result.stdout, name


def test_every_archive_is_a_valid_oci_layout_that_skopeo_reads(index: dict) -> None:
    assert set(index["images"]) == {"pdfleet-operator", "pdfleet-runtime", "pdfleet-engine-cpu"}
    for name, entry in index["images"].items():
        archive = Path(entry["archive"])
        assert archive.stat().st_size == entry["archiveSize"]
        read = oci.read_archive(archive)
        assert read["index"]["manifests"][0]["digest"] == entry["digest"]
        assert read["index"]["manifests"][0]["annotations"][oci.CONTAINERD_NAME] == entry["reference"]
        assert read["config"]["config"]["User"] == f"{NONROOT}:{NONROOT}"
        inspected = json.loads(ok(subprocess.run(["skopeo", "inspect", f"oci-archive:{archive}"],
                                                 capture_output=True, text=True, timeout=300)))
        assert inspected["Digest"] == entry["digest"], name
        assert inspected["Labels"]["dev.pdfleet.debian-packages"], "resolved Debian versions are recorded"


def test_the_operator_starts_as_65532_without_pip_compilers_or_apt(operator_bundle: runc.Bundle) -> None:
    assert operator_bundle.config["process"]["args"] == ["pdfleet-operator"]
    assert "usage" in ok(operator_bundle.run(["pdfleet-operator", "--help"])).lower()
    probe = ("import os, importlib.metadata as m, kopf; "
             "print(os.getuid(), os.getgid(), m.version('kopf'), os.environ['HOME'], os.environ['PYTHONUNBUFFERED'])")
    assert ok(operator_bundle.run(["python3", "-c", probe])).split() == [NONROOT, NONROOT, "1.45.2", "/tmp", "1"]
    root = operator_bundle.rootfs
    for tool in ("pip", "pip3", "gcc", "cc", "apt", "apt-get", "dpkg-deb"):
        for directory in ("usr/bin", "usr/local/bin", "opt/pdfleet/bin", "bin"):
            path = root / directory / tool
            assert not (path.exists() or path.is_symlink()) or tool == "dpkg-deb", f"{path} is in the image"
    assert not list((root / "opt/pdfleet/lib/python3.11/site-packages").glob("pip*")), "pip is in the image"
    assert not any((root / "var/lib/apt/lists").iterdir()) and not any((root / "var/cache/apt").iterdir())


def test_every_operator_module_imports_in_the_image(operator_bundle: runc.Bundle) -> None:
    """The operator extra's dependencies are all there (a module importing a dev-only package fails here)."""
    script = ("import importlib, pkgutil, pdfleet.operator as o\n"
              "names = [m.name for m in pkgutil.walk_packages(o.__path__, 'pdfleet.operator.')]\n"
              "[importlib.import_module(n) for n in names]\nprint(len(names))")
    assert int(ok(operator_bundle.run(["python3", "-c", script]))) > 20


def test_the_runtime_init_container_copies_the_runtime_as_65532(index: dict, tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    volume.mkdir(mode=0o777)
    volume.chmod(0o777)
    with runc.unpacked(index["images"]["pdfleet-runtime"]["archive"]) as bundle:
        assert ok(bundle.run(["id", "-u"])).strip() == NONROOT
        assert not (bundle.rootfs / "usr/bin/python3").exists(), "the runtime image needs no Python"
        # The operator's init container: command pdfleet-install-runtime /opt/pdfleet, twice (a restart).
        for _ in range(2):
            result = bundle.run(["pdfleet-install-runtime", engine_group.RUNTIME_MOUNT],
                                mounts=[(volume, engine_group.RUNTIME_MOUNT)])
            assert result.returncode == 0, result.stderr
        assert "runtime installed in /opt/pdfleet/lib/pdfleet/runtime" in result.stderr
    lib = volume / "lib" / "pdfleet"
    assert sorted(p.name for p in lib.iterdir()) == ["kernels", "runtime"]
    assert (lib / "runtime" / "bootstrap" / "sitecustomize.py").is_file()
    assert {p.stat().st_uid for p in lib.rglob("*")} == {int(NONROOT)}


def test_the_engine_image_imports_sglang_and_the_router_as_65532(engine_bundle: runc.Bundle) -> None:
    probe = ("import os, sys, warnings; warnings.simplefilter('ignore'); import sglang, sglang_router; "
             "print(os.getuid(), sys.executable, sglang.__version__, os.environ['PDFLEET_ENGINE_MODE'])")
    out = ok(engine_bundle.run(["python3", "-c", probe], timeout=600)).split()
    assert out == [NONROOT, "/opt/sglang/bin/python3", "0.5.23", "simulate"]
    assert "--pd-disaggregation" in ok(engine_bundle.run(["python3", "-m", "sglang_router.launch_router", "--help"],
                                                         timeout=600))
    root = engine_bundle.rootfs
    assert not (root / "usr/bin/gcc").exists() and not (root / "usr/bin/apt-get").exists()
