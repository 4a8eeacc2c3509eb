"""A scale-down on the local fleet removes the group with the least work: long streams run on the highest-numbered
decode group (the one a scale-down used to remove), the role is scaled from 2 to 1 by a plain replicas edit, and
the idle group goes while the busy one keeps its pod, its name and every stream to the end."""

from __future__ import annotations

import concurrent.futures
import json
import random
from typing import Any

import httpx
import pytest

from pdfleet.operator.api.roles import DEFAULT_ENGINE_PORT
from pdfleet.operator.render import labels
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

POOL = "leastwork"
STREAMS = 3
TOKENS = 1500  # about 15 s at the simulator's 10 ms decode step, longer on a loaded machine
# SGLang's own PD health probe names this bootstrap host: the decode engine takes the request without any KV
# transfer, so a client can hold a stream on one chosen decode engine (nothing is ever sent to this address).
FAKE_BOOTSTRAP = {"bootstrap_host": "2.2.2.2", "bootstrap_port": 1}


def _stream(url: str, started: list[str]) -> dict[str, Any]:
    """One streamed /generate on the engine at `url`, to its end: its last chunk."""
    body = {"input_ids": [1, 2, 3], "stream": True, "bootstrap_room": random.getrandbits(63), **FAKE_BOOTSTRAP,
            "sampling_params": {"max_new_tokens": TOKENS, "ignore_eos": True}}
    last: dict[str, Any] = {}
    with httpx.stream("POST", url + "/generate", json=body, timeout=httpx.Timeout(10, read=120)) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                last = json.loads(line[len("data: "):])
                if not started or started[-1] != url:
                    started.append(url)
    return last


def _decode_pods(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["labels"][labels.GROUP]: p for p in fleet.engine_pods(cluster, namespace, POOL, role="decode")
            if not p["metadata"].get("deletionTimestamp")}


def test_a_scale_down_removes_the_idle_group_and_the_busy_one_keeps_its_streams(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={"replicas": 2})
    fleet.wait_ready(cluster, namespace, POOL, timeout=240)
    pods = _decode_pods(cluster, namespace)
    busy_group, idle_group = f"{POOL}-decode-1", f"{POOL}-decode-0"
    assert sorted(pods) == [idle_group, busy_group]
    busy = pods[busy_group]
    port = fleet.pool(cluster, namespace, POOL)["spec"]["decode"].get("port", DEFAULT_ENGINE_PORT)
    url = f"http://{busy['status']['podIP']}:{port}"
    started: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        streams = [pool.submit(_stream, url, started) for _ in range(STREAMS)]
        wait_for("the streams running on the busy group", lambda: len(started) >= 1 and
                 all(not s.done() for s in streams), timeout=30, interval=0.2)
        cluster.kubectl("patch", "pdpool", POOL, "-n", namespace, "--type=merge",
                        "-p", json.dumps({"spec": {"decode": {"replicas": 1}}}))
        wait_for("one decode group left", lambda: len(_decode_pods(cluster, namespace)) == 1, timeout=60,
                 interval=0.3)
        left = _decode_pods(cluster, namespace)
        endings = [s.result(timeout=180) for s in streams]
    lines = fleet.event_lines(cluster, namespace)
    assert sorted(left) == [busy_group], (sorted(left), lines)
    assert left[busy_group]["metadata"]["uid"] == busy["metadata"]["uid"], "the busy group was never replaced"
    for end in endings:
        meta = end.get("meta_info") or {}
        assert meta.get("completion_tokens") == TOKENS and (meta.get("finish_reason") or {}).get("type") == "length", \
            (end, lines)
    deleted = [e["message"] for e in fleet.events(cluster, namespace, POOL, "GroupDeleted")]
    assert deleted == [f"deleted group {idle_group}: scaled down"], (deleted, lines)
    status = fleet.pool(cluster, namespace, POOL)["status"]
    assert [g["name"] for g in status["groups"] if g["role"] == "decode"] == [busy_group]
