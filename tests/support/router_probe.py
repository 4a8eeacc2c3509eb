"""What each router pod of a pool answers a client, sampled every fraction of a second from a thread: the view of a
user whose connection lands on that router, whichever state it is in (Ready or not)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import Any

NO_WORKERS = "No available"  # sglang-router's 503 when every worker of a role is unhealthy or its circuit open


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float  # monotonic
    router: str  # the router pod's name
    status: int  # 0: no answer
    body: str

    @property
    def no_workers(self) -> bool:
        return self.status == 503 and NO_WORKERS in self.body


def ask(url: str, timeout: float) -> tuple[int, str]:
    body = json.dumps({"text": "probe", "sampling_params": {"max_new_tokens": 2}}).encode()
    request = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read(300).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(300).decode(errors="replace")
    except OSError:
        return 0, ""


@contextlib.contextmanager
def sampling(routers: Callable[[], Sequence[tuple[str, str]]], *, every_s: float = 0.25,
             timeout_s: float = 5.0) -> Iterator[list[Sample]]:
    """Asks every (pod name, URL) that `routers` returns, one thread per router, until the block ends."""
    samples: list[Sample] = []
    stop = threading.Event()
    threads: dict[str, threading.Thread] = {}

    def probe(name: str, url: str) -> None:
        while not stop.is_set():
            started = time.monotonic()
            status, body = ask(url, timeout_s)
            samples.append(Sample(started, name, status, body))
            stop.wait(max(0.0, every_s - (time.monotonic() - started)))

    def follow() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a failed listing is retried at the next turn
                for name, url in routers():
                    if name not in threads:
                        threads[name] = threading.Thread(target=probe, args=(name, url), daemon=True)
                        threads[name].start()
            stop.wait(0.5)
    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        yield samples
    finally:
        stop.set()
        follower.join()
        for thread in threads.values():
            thread.join(timeout=timeout_s + 1)


def pod_urls(pods: Sequence[dict[str, Any]], port: int) -> list[tuple[str, str]]:
    """(name, URL) of each router pod with an address, Ready or not."""
    return [(p["metadata"]["name"], f"http://{p['status']['podIP']}:{port}") for p in pods
            if (p.get("status") or {}).get("podIP") and not p["metadata"].get("deletionTimestamp")]


def longest_no_workers(samples: Sequence[Sample], since: float) -> dict[str, float]:
    """For each router, the longest stretch (seconds) from `since` on in which it answered nothing but "no
    available workers" 503s: from the first such answer to the first answer of another kind after it."""
    longest: dict[str, float] = {}
    for router in {s.router for s in samples}:
        mine = sorted((s for s in samples if s.router == router and s.at >= since), key=lambda s: s.at)
        start: float | None = None
        worst = 0.0
        for s in mine:
            if s.no_workers:
                start = s.at if start is None else start
                worst = max(worst, s.at - start)
            elif start is not None:
                worst = max(worst, s.at - start)
                start = None
        longest[router] = worst
    return longest
