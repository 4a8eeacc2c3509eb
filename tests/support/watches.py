"""What the apiserver's watch shows of objects while a test runs (`kubectl get --watch`, from a thread): every
version, not samples, so a state that lasted between two of a test's reads (a group replaced twice, a size that
came and went) is still seen."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import subprocess
import threading
import time
from collections.abc import Iterator

from tests.support.cluster import Cluster


@dataclasses.dataclass(frozen=True)
class Seen:
    """One version as printed, with when it was read (monotonic, and wall-clock to compare with Events)."""

    at: float
    wall: datetime.datetime
    line: str


class Watch:
    """`kubectl get WHAT --watch -o OUTPUT`: one line per version (a jsonpath ending in a newline, or
    custom-columns; headers are left out)."""

    def __init__(self, cluster: Cluster, *what: str, output: str) -> None:
        self.seen: list[Seen] = []
        self._proc = subprocess.Popen(["kubectl", "get", *what, "--watch", "--no-headers", "-o", output],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.strip():
                self.seen.append(Seen(time.monotonic(), datetime.datetime.now(datetime.UTC), line.rstrip("\n")))

    def stop(self) -> str:
        """Ends the watch once every line it printed is read; its stderr. A watch that had ended by itself saw
        only part of the story: that fails the test (kubectl ends a watch on some outputs without an error)."""
        ended = self._proc.poll()
        self._proc.terminate()
        self._thread.join(timeout=30)  # the reader takes stdout to its end
        self._proc.wait(timeout=30)
        assert self._proc.stderr is not None
        err = self._proc.stderr.read()
        assert ended is None, f"kubectl get --watch ended by itself (exit {ended}) before the test did: {err}"
        return err


@contextlib.contextmanager
def watching(cluster: Cluster, *what: str, output: str) -> Iterator[Watch]:
    watch = Watch(cluster, *what, output=output)
    try:
        yield watch
    finally:
        watch.stop()
