"""A missing prerequisite stops the tooling with a message that names it and says how to fix it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ports import outside_ephemeral

ROOT = Path(__file__).resolve().parents[2]
CACHE_BIN = Path(os.environ.get("PDFLEET_CACHE", Path.home() / ".cache" / "pdfleet")) / "bin"


def localcluster(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "hack" / "localcluster.py"), *args], env=env, text=True,
                          capture_output=True, timeout=60)


@pytest.fixture
def isolated_env(tmp_path: Path) -> dict[str, str]:
    ports = outside_ephemeral({"PDFLEET_ETCD_PORT": "25790", "PDFLEET_ETCD_PEER_PORT": "25800",
                               "PDFLEET_APISERVER_PORT": "26444"})
    env = os.environ | ports | {"PDFLEET_CLUSTER_DIR": str(tmp_path / "cluster")}
    env.pop("PDFLEET_KUBECONFIG", None)
    return env


@pytest.fixture
def fake_bin(tmp_path: Path) -> Iterator[Path]:
    """A binary folder whose 'binaries' exit at once: enough to get past the binary check."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl", "kueue"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 3\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_missing_binaries_are_named_with_the_command_that_builds_them(isolated_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    result = localcluster(isolated_env | {"PDFLEET_BIN": str(tmp_path / "empty")}, "up")
    assert result.returncode == 1
    assert "missing binaries" in result.stderr
    assert "kube-apiserver" in result.stderr
    assert "etcd" in result.stderr
    assert "kueue" in result.stderr
    assert "make binaries" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_taken_port_is_named_with_the_variable_that_moves_it(isolated_env: dict[str, str],
                                                               fake_bin: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = localcluster(isolated_env | {"PDFLEET_BIN": str(fake_bin), "PDFLEET_ETCD_PORT": str(port)}, "up")
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stderr
    assert "already in use" in result.stderr
    assert "PDFLEET_ETCD_PORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_component_that_dies_at_start_shows_its_log(isolated_env: dict[str, str], fake_bin: Path) -> None:
    result = localcluster(isolated_env | {"PDFLEET_BIN": str(fake_bin)}, "up")
    assert result.returncode == 1
    assert "etcd exited with code 3 while starting" in result.stderr


def test_missing_openssl_is_named(isolated_env: dict[str, str], fake_bin: Path, tmp_path: Path) -> None:
    no_openssl = tmp_path / "path"
    no_openssl.mkdir()
    result = localcluster(isolated_env | {"PDFLEET_BIN": str(fake_bin), "PATH": str(no_openssl)}, "up")
    assert result.returncode == 1
    assert "openssl is not installed" in result.stderr


def test_a_bad_port_value_is_named(isolated_env: dict[str, str]) -> None:
    result = localcluster(isolated_env | {"PDFLEET_APISERVER_PORT": "sixty"}, "up")
    assert result.returncode == 1
    assert "PDFLEET_APISERVER_PORT='sixty' is not a port number" in result.stderr


def build_binaries(env: dict[str, str], *components: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "hack" / "build-binaries.sh"), *components], env=env, text=True,
                          capture_output=True, timeout=120)


def test_build_without_go_says_how_to_install_it(tmp_path: Path) -> None:
    path = tmp_path / "path"
    path.mkdir()
    for tool in ("bash", "sed", "cat", "grep", "dirname", "tail", "mkdir"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        (path / tool).symlink_to(found)
    result = build_binaries(os.environ | {"PATH": str(path), "PDFLEET_CACHE": str(tmp_path / "cache")}, "kwok")
    assert result.returncode == 1
    assert "Go is not installed" in result.stderr
    assert "go.dev/doc/install" in result.stderr


def test_build_names_a_module_the_proxy_refuses(tmp_path: Path) -> None:
    env = os.environ | {"PDFLEET_CACHE": str(tmp_path / "cache"), "GOPROXY": "off", "GOFLAGS": "-mod=mod",
                        "KWOK_VERSION": "v0.0.1-pdfleet-does-not-exist"}
    result = build_binaries(env, "kwok")
    assert result.returncode == 1
    assert "Go module proxy did not serve a module" in result.stderr
    assert "Traceback" not in result.stderr


def test_cached_binaries_are_not_rebuilt(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "bin").mkdir(parents=True)
    (cache / "bin" / "kwok").write_text("#!/bin/sh\n")
    (cache / "bin" / "kwok").chmod(0o755)
    (cache / "bin" / ".kwok.version").write_text("v9.9.9\n")
    result = build_binaries(os.environ | {"PDFLEET_CACHE": str(cache), "GOPROXY": "off", "KWOK_VERSION": "v9.9.9"},
                            "kwok")
    assert result.returncode == 0, result.stderr
    assert "kwok v9.9.9: cached" in result.stderr
