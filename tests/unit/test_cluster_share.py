"""The cluster tests' readers-writer lock (tests/support/cluster_share.py): a disruptive test waits for the tests
already running and no test starts while it waits or runs. Threads stand in for pytest-xdist workers: each hold
opens its own files, so the locks are as separate as two processes'."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.support import cluster_share

NOT_WITHIN_S = 0.3  # how long a blocked hold is given to show it stays blocked


def holder(kubeconfig: Path, exclusive: bool, entered: threading.Event, leave: threading.Event) -> threading.Thread:
    def run() -> None:
        with cluster_share.hold(kubeconfig, exclusive=exclusive):
            entered.set()
            leave.wait(30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_readers_share_a_writer_waits_for_them_and_a_later_reader_waits_for_the_writer(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    r1, r2, w, r3 = (threading.Event() for _ in range(4))
    leave_r1, leave_r2, leave_w, leave_r3 = (threading.Event() for _ in range(4))
    threads = [holder(kubeconfig, False, r1, leave_r1), holder(kubeconfig, False, r2, leave_r2)]
    assert r1.wait(10) and r2.wait(10), "two readers hold it together"

    threads.append(holder(kubeconfig, True, w, leave_w))
    assert not w.wait(NOT_WITHIN_S), "the writer waits for the readers already in"
    threads.append(holder(kubeconfig, False, r3, leave_r3))
    assert not r3.wait(NOT_WITHIN_S), "a reader arriving after the writer waits behind it"

    leave_r1.set()
    leave_r2.set()
    assert w.wait(10), "the writer gets it once the readers are out"
    assert not r3.is_set(), "and holds it alone"
    leave_w.set()
    assert r3.wait(10)
    leave_r3.set()
    for thread in threads:
        thread.join(10)
