"""The local cluster's shared files (its kubeconfig above all) are rewritten by every `up`, including the `up` a
test runs to restart a component it stopped, while other test workers' kubectl read them: a reader must never see
a truncated file (kubectl then falls back to localhost:8080 and a test fails on a refusal it never got)."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def localcluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("PDFLEET_CLUSTER_DIR", str(tmp_path / "cluster"))
    monkeypatch.delenv("PDFLEET_KUBECONFIG", raising=False)
    spec = importlib.util.spec_from_file_location("localcluster_under_test", ROOT / "hack" / "localcluster.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through the module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_a_reader_sees_the_old_or_the_new_file_never_a_partial_one(localcluster: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    old, new = "old\n" * 20_000, "new\n" * 30_000
    localcluster.write_file(path, old, mode=0o600)
    partial: list[int] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            text = path.read_text()
            if text not in (old, new):
                partial.append(len(text))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(300):
            localcluster.write_file(path, new if i % 2 == 0 else old, mode=0o600)
    finally:
        done.set()
        reader.join()
    assert not partial, f"a reader saw {len(partial)} partial file(s), of {sorted(set(partial))[:5]} characters"
    assert not list(tmp_path.glob(".kubeconfig.*")), "a temporary file was left behind"


def test_an_unchanged_kubeconfig_is_not_rewritten(localcluster: ModuleType) -> None:
    ports = localcluster.Ports.from_env()
    localcluster.DIR.mkdir(parents=True)
    localcluster.write_kubeconfig(ports)
    path = localcluster.DIR / "kubeconfig"
    before = path.stat()
    localcluster.write_kubeconfig(ports)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert after.st_mode & 0o777 == 0o600
    assert f"server: https://127.0.0.1:{ports.apiserver}" in path.read_text()
