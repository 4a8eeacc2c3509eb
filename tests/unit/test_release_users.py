"""The shared chart release is uninstalled by the last process that uses it, never from under another's module
(tests/support/release_users.py)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from tests.support import release_users


def test_the_release_is_uninstalled_only_once_no_live_process_uses_it(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    calls: list[str] = []

    def use() -> contextlib.AbstractContextManager[None]:
        return release_users.using(kubeconfig, "r", install=lambda: calls.append("install"),
                                   uninstall=lambda: calls.append("uninstall"))

    other = subprocess.Popen(["sleep", "60"])  # another pytest process, in a module on the same release
    try:
        release_users._path(kubeconfig, "r").write_text(f"{other.pid}\n")
        with use():
            with use():  # this process in two modules at once (nested fixtures): counted twice
                pass
            assert calls == ["install", "install"]
        assert calls == ["install", "install"], "another live process still uses the release"
    finally:
        other.kill()
        other.wait()
    with use():
        pass
    assert calls == ["install", "install", "install", "uninstall"], "a dead user is dropped; the last one uninstalls"
    assert release_users._path(kubeconfig, "r").read_text() == ""
