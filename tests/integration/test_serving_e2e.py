"""End to end: requests flow through a pool. Client -> the real sglang-router (discovering engines by label,
as the pool's ServiceAccount) -> simulated prefill and decode engines, with the PD bootstrap between them.

The operator runs as in `test_operator_e2e.py`; `pdfleet-sim` plays every pod. Nothing is faked between the
client and the engines' HTTP surface.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from pdfleet.podrunner import loadgen
from tests.support import fleet
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster

POOL = "fleet"
MODEL = "qwen2.5-0.5b-instruct"


@contextlib.contextmanager
def health_samples(url: str) -> Iterator[list[tuple[float, int]]]:
    """(time, status) of `url` every 0.25 s from a thread, until the block ends (0: no answer)."""
    samples: list[tuple[float, int]] = []
    with fleet.every(0.25, lambda: samples.append((time.monotonic(), fleet.http_get(url, timeout=2)[0]))):
        yield samples


def test_a_2p2d_pool_serves_generate_and_chat_through_the_real_router(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL)
    fleet.wait_ready(cluster, namespace, POOL)
    url = fleet.router_url(cluster, namespace, POOL, workers=4)

    r = httpx.post(f"{url}/generate", json={"text": "the capital of France is",
                                            "sampling_params": {"max_new_tokens": 8}}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text"] and body["meta_info"]["completion_tokens"] == 8

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=30)
    chat = client.chat.completions.create(model=MODEL, max_tokens=12,
                                          messages=[{"role": "user", "content": "hello"}])
    assert chat.choices[0].message.content and chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 12
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, max_tokens=12, stream=True, messages=[{"role": "user", "content": "hello"}]) if c.choices]
    assert "".join(pieces)
    assert [m.id for m in client.models.list().data] == [MODEL]

    # Every engine saw PD traffic. A PD engine refuses a request without bootstrap fields (as SGLang does), so
    # each one it served came from the router with them, and each decode fetched its KV from a prefill engine.
    with fleet.steady_load(url, model=MODEL) as load:
        wait_for("requests on every engine", lambda: all(
            served(pod) > 0 for pod in fleet.engine_pods(cluster, namespace, POOL)), timeout=60)
    assert load.tally.failed == 0, load.tally.summary()
    # Clients that hang up mid-stream are an everyday event: the engines must shrug them off.
    engines = {p["metadata"]["uid"] for p in fleet.engine_pods(cluster, namespace, POOL)}
    for _ in range(6):
        with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30, json={
                "model": MODEL, "max_tokens": 300, "stream": True,
                "messages": [{"role": "user", "content": "a long answer, please"}]}) as stream:
            next(stream.iter_lines())
    r = httpx.post(f"{url}/generate", json={"text": "still there?", "sampling_params": {"max_new_tokens": 4}},
                   timeout=30)
    assert r.status_code == 200, r.text
    pods = fleet.engine_pods(cluster, namespace, POOL)
    assert {p["metadata"]["uid"] for p in pods} == engines and all(fleet.is_ready(p) for p in pods)
    decode_ip = fleet.engine_pods(cluster, namespace, POOL, role="decode")[0]["status"]["podIP"]
    direct = httpx.post(f"http://{decode_ip}:30000/generate", json={"text": "no bootstrap"}, timeout=10)
    assert direct.status_code == 400 and "bootstrap room" in direct.text


def registered(url: str, key: str) -> dict[str, str]:
    """The router's workers: url -> worker_type."""
    listed = fleet.workers(url, key)
    assert listed is not None, f"{url} did not list its workers"
    return {w["url"]: w["worker_type"] for w in listed}


def set_ready(cluster: Cluster, namespace: str, pod: dict, ready: bool) -> None:
    """Flips the pod's Ready condition as kubelet would on a readiness failure (the runner leaves it so until its
    own view changes)."""
    current = cluster.get("pod", pod["metadata"]["name"], "-n", namespace)
    index = next(i for i, c in enumerate(current["status"]["conditions"]) if c["type"] == "Ready")
    patch = [{"op": "replace", "path": f"/status/conditions/{index}/status", "value": "True" if ready else "False"}]
    cluster.kubectl("patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status",
                    "--type=json", "-p", json.dumps(patch))


def test_the_operator_keeps_the_routers_workers_to_what_it_judged(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    """sglang-router 0.3.2's discovery keeps a pod that turns NotReady in rotation and never drops a stale
    registration; the operator corrects both through the router's worker API (docs/router.md)."""
    fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={"replicas": 2})
    fleet.wait_ready(cluster, namespace, POOL)
    url = fleet.router_url(cluster, namespace, POOL, workers=3)
    key = fleet.router_key(cluster, namespace, POOL)

    # An engine that is no pod of the pool (the leftover of a deleted pod, say) gets registered, by someone
    # holding the control-plane key: the router itself would keep it for good.
    with fleet.foreign_engine("127.1.9.9", 30000) as stale:
        r = httpx.post(f"{url}/workers", json={"url": stale, "worker_type": "decode"}, headers=fleet.admin(key),
                       timeout=10)
        assert r.status_code < 300, r.text
        wait_for("the router to register it", lambda: stale in registered(url, key), timeout=60)
        wait_for("the operator to remove it", lambda: stale not in registered(url, key), timeout=30)
    pod = fleet.engine_pods(cluster, namespace, POOL, group=f"{POOL}-decode-1")[0]
    own = f"http://{pod['status']['podIP']}:30000"
    set_ready(cluster, namespace, pod, False)
    wait_for("the NotReady decode engine out of rotation", lambda: own not in registered(url, key), timeout=30)
    reasons = {e["message"].rsplit(": ", 1)[-1] for e in fleet.events(cluster, namespace, POOL,
                                                                       "RouterWorkerRemoved")}
    assert {"not Ready", "no such engine in the pool"} <= reasons, reasons

    set_ready(cluster, namespace, pod, True)
    wait_for("the engine back in rotation", lambda: registered(url, key).get(own) == "decode", timeout=30)
    assert fleet.events(cluster, namespace, POOL, "RouterWorkerAdded")
    assert operator.metric("pdfleet_router_worker_changes_total", action="remove") >= 2


def metric(pod: dict, name: str) -> float:
    code, text = fleet.http_get(f"http://{pod['status']['podIP']}:30000/metrics")
    assert code == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def served(pod: dict) -> float:
    return metric(pod, "sglang:num_requests_total")


def _models_status(url: str) -> int | None:
    """The engine's answer to /v1/models: its HTTP status, -1 when it refuses the connection, None when it does not
    answer within 3 s."""
    try:
        return httpx.get(f"{url}/v1/models", timeout=3).status_code
    except httpx.TimeoutException:
        return None
    except httpx.TransportError:
        return -1


def test_an_engine_that_is_not_up_yet_is_not_ready_and_gets_no_traffic(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    # Each engine takes 6 s to "load its weights" before it serves: its pod runs, but must not be Ready.
    fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={"replicas": 1},
                     engine={"env": [{"name": "PDFLEET_SIM_LOAD_S", "value": "6"}]})
    loading = 0
    while fleet.phase(cluster, namespace, POOL) != "Ready":
        pods = [p for p in fleet.engine_pods(cluster, namespace, POOL) if (p.get("status") or {}).get("podIP")]
        for pod in pods:
            # Ready may lag the engine by a probe period; it must never lead it. Ready is read first: an engine
            # that serves keeps serving, so a pod Ready then must find its engine serving after. An engine that
            # does not answer in time (a loaded machine) says nothing either way.
            ready = fleet.is_ready(cluster.get("pod", pod["metadata"]["name"], "-n", namespace))
            answer = _models_status(f"http://{pod['status']['podIP']}:30000")
            if answer != 200:
                loading += 1
            assert not ready or answer in (200, None), \
                f"{pod['metadata']['name']} is Ready before its engine serves (/v1/models: {answer})"
        routers = [p for p in fleet.router_pods(cluster, namespace, POOL) if (p.get("status") or {}).get("podIP")]
        # No engine Ready: the router has nobody to send to. The pods above were listed before this call, so an
        # engine may have turned Ready in between; only a router that is ready while still none is fails.
        if routers and len(pods) == 2 and not any(fleet.is_ready(p) for p in pods) and \
                fleet.http_get(f"http://{routers[0]['status']['podIP']}:30000/readiness")[0] == 200:
            assert any(fleet.is_ready(p) for p in fleet.engine_pods(cluster, namespace, POOL)), \
                "the router is ready while no engine is"
        assert loading < 500, "the pool never became Ready"
    assert loading >= 2, "the engines were never seen loading"
    url = fleet.router_url(cluster, namespace, POOL, workers=2)
    r = httpx.post(f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}}, timeout=30)
    assert r.status_code == 200, r.text


def test_a_desync_under_load_is_detected_and_the_group_replaced_while_the_rest_keeps_serving(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    fleet.apply_pool(cluster, namespace, POOL, health={"restartBudget": {"count": 3, "window": "1h"}})
    fleet.wait_ready(cluster, namespace, POOL)
    url = fleet.router_url(cluster, namespace, POOL, workers=4)
    victim = fleet.engine_pods(cluster, namespace, POOL, group=f"{POOL}-decode-0")[0]
    others = {p["metadata"]["uid"] for p in fleet.engine_pods(cluster, namespace, POOL)} - {victim["metadata"]["uid"]}
    victim_url = f"http://{victim['status']['podIP']}:30000"

    with fleet.steady_load(url, model=MODEL) as load, health_samples(f"{victim_url}/health") as health:
        wait_for("requests succeeding", lambda: load.tally.ok >= 20, timeout=60)
        injected_at = time.monotonic()
        fleet.inject(cluster, namespace, victim["metadata"]["name"], "desync")

        def replaced() -> bool:
            pods = fleet.engine_pods(cluster, namespace, POOL, group=f"{POOL}-decode-0")
            fresh = [p for p in pods if p["metadata"]["uid"] != victim["metadata"]["uid"]]
            return len(pods) == 1 and len(fresh) == 1 and fleet.is_ready(fresh[0])
        desync = wait_for("the Desync event", lambda: fleet.events(cluster, namespace, POOL, "GroupDesync"),
                          timeout=60)
        detected_s = time.monotonic() - injected_at
        during = [code for t, code in health if injected_at <= t <= time.monotonic()]
        assert f"{POOL}-decode-0" in desync[0]["message"]
        # The sick group left the router's rotation with the verdict, before its restart.
        removed = wait_for("the desynced engine out of rotation", lambda: [
            e for e in fleet.events(cluster, namespace, POOL, "RouterWorkerRemoved") if e["type"] == "Warning"],
            timeout=30)
        assert removed[0]["message"].endswith(": Desync") and victim["status"]["podIP"] in removed[0]["message"]
        wait_for("evidence", lambda: cluster.get("configmaps", "-n", namespace, "-l",
                                                 "pdfleet.dev/evidence=true")["items"], timeout=30)
        wait_for("the decode group replaced and Ready", replaced, timeout=120, interval=0.3)
        fleet.wait_ready(cluster, namespace, POOL, timeout=60)
        restored_ok = load.tally.ok
        wait_for("requests succeeding on the restored pool", lambda: load.tally.ok >= restored_ok + 20, timeout=60)
    tally = load.tally.summary()
    print(f"desync detected after {detected_s:.1f}s; client requests: {tally}")
    # From the injection until the verdict, the desynced engine's /health said 200 every time: the failure
    # /health misses.
    assert len(during) >= 3 and set(during) == {200}, during
    assert {p["metadata"]["uid"] for p in fleet.engine_pods(cluster, namespace, POOL)} >= others
    decode = fleet.group_status(cluster, namespace, POOL, f"{POOL}-decode-0")
    if decode["restarts"] != 1:
        print("decode-0:", json.dumps(decode, indent=1), *fleet.event_lines(cluster, namespace), sep="\n")
    assert decode["restarts"] == 1


def container_pid(pod: dict) -> int:
    """The pid of a pod's first container on the local fleet, from its containerID (`pdfleet-sim://<pid>`): the
    runner execs it, and sglang-router renames its process (`sglang::router`), so its command line cannot say."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    assert container_id.startswith("pdfleet-sim://"), container_id
    return int(container_id.removeprefix("pdfleet-sim://"))


def test_a_router_killed_under_load_costs_only_the_requests_in_flight_on_it(
        cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    """Two routers by default; a client behind their Service (following the Ready router pods) loses at most
    what was in flight on the one that died, while its container restarts."""
    fleet.apply_pool(cluster, namespace, POOL, prefill={"replicas": 1}, decode={"replicas": 1})
    fleet.wait_ready(cluster, namespace, POOL)
    url = fleet.router_url(cluster, namespace, POOL, workers=2)

    def both_ready() -> list[dict] | None:
        pods = fleet.router_pods(cluster, namespace, POOL)
        return pods if len(loadgen.ready_urls(pods)) == 2 else None
    routers = wait_for("two Ready routers", both_ready, timeout=120)
    victim = routers[0]
    concurrency = 4
    with fleet.ready_routers(cluster, namespace, POOL) as endpoints, \
            fleet.steady_load(url, model=MODEL, concurrency=concurrency, endpoints=lambda: endpoints) as load:
        wait_for("the load served through both routers",
                 lambda: load.tally.summary()["ok"] >= 40 and len(load.used) == 2, timeout=60)
        os.kill(container_pid(cluster.get("pod", victim["metadata"]["name"], "-n", namespace)), signal.SIGKILL)
        killed_at = load.tally.summary()["ok"]

        def restarted() -> bool:
            pod = cluster.get("pod", victim["metadata"]["name"], "-n", namespace)
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            return bool(statuses) and statuses[0].get("restartCount", 0) >= 1 and fleet.is_ready(pod)
        wait_for("the killed router's container restarted and Ready", restarted, timeout=120, interval=0.5)
        wait_for("requests served after the restart", lambda: load.tally.summary()["ok"] >= killed_at + 40,
                 timeout=60)
    summary = load.tally.summary()
    assert summary["failed"] <= concurrency, (
        f"more failures than requests that can be in flight on the killed router: {summary}")
