"""The readiness sidecar of a router with circuit breakers (runtime/router_ready.py): pure parts, then against the
real sglang-router whose circuits real failures opened."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path

import httpx
import pytest

from pdfleet.runtime import router_ready
from tests.support import sim_engine
from tests.support.ports import free_port

KEY = "test-admin-key"
METRICS = """# HELP smg_worker_cb_state Circuit breaker state
smg_worker_cb_state{worker="http://10.0.0.1:30000"} 1
smg_worker_cb_state{worker="http://10.0.0.2:30000"} 0
smg_worker_health{worker="http://10.0.0.1:30000"} 1
"""


def test_circuit_states_are_read_from_the_routers_metrics() -> None:
    assert router_ready.circuit_states(METRICS) == {"http://10.0.0.1:30000": 1, "http://10.0.0.2:30000": 0}


def test_a_role_whose_workers_are_all_open_or_unhealthy_makes_the_router_not_ready() -> None:
    workers = [{"url": "http://10.0.0.1:30000", "worker_type": "prefill", "is_healthy": True},
               {"url": "http://10.0.0.3:30000", "worker_type": "prefill", "is_healthy": False},
               {"url": "http://10.0.0.2:30000", "worker_type": "decode", "is_healthy": True}]
    counts = router_ready.available(workers, router_ready.circuit_states(METRICS))
    assert counts == {"prefill": 0, "decode": 1}
    ready, why = router_ready.verdict(counts)
    assert not ready and "no available prefill worker" in why
    assert router_ready.verdict({"prefill": 1, "decode": 2})[0]


def test_a_router_that_does_not_answer_is_not_ready() -> None:
    ready, why = router_ready.check(f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}", KEY)
    assert not ready and "does not answer" in why


def test_the_verdict_is_logged_when_it_changes_not_at_every_probe(capsys: pytest.CaptureFixture[str]) -> None:
    verdicts = router_ready.Verdicts()
    for ready, why in [(False, "the router does not answer"), (False, "no available prefill worker"),
                       (False, "no available prefill worker"), (True, "available workers: 2"),
                       (True, "available workers: 2"), (False, "gone")]:
        verdicts.said(ready, why)
    assert capsys.readouterr().err.splitlines() == [
        "pdfleet-router-ready: not ready: the router does not answer",
        "pdfleet-router-ready: not ready: no available prefill worker",
        "pdfleet-router-ready: ready: available workers: 2", "pdfleet-router-ready: not ready: gone"]


def _ready(url: str) -> tuple[int, str]:
    answer = httpx.get(url + "/ready", timeout=10)
    return answer.status_code, answer.json()["reason"]


def _active(metrics_port: int, worker: str) -> float:
    """The requests the router has in flight on `worker`, from its metrics."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    line = next((x for x in text.splitlines() if x.startswith(f'smg_worker_requests_active{{worker="{worker}"}}')), "")
    return float(line.split()[-1]) if line else 0.0


def _generate(url: str) -> int:
    try:
        return httpx.post(url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                          timeout=60).status_code
    except httpx.HTTPError:
        return 0


def test_the_real_routers_open_prefill_circuits_make_it_not_ready_and_a_re_registration_ready_again(
        tmp_path: Path) -> None:
    """Requests held by a hung decode engine fail when it dies, and sglang-router charges each failure to the
    prefill engine it was paired with too: its circuit opens though it is healthy. The router's own /readiness
    still says ready; the sidecar does not, until the prefill worker is registered again."""
    engines = {"prefill": sim_engine.start(tmp_path, "prefill", tp=1),
               "decode-0": sim_engine.start(tmp_path, "decode", tp=1),
               "decode-1": sim_engine.start(tmp_path, "decode", tp=1)}
    with sim_engine.serving(engines):
        prefill, hung, healthy = engines["prefill"], engines["decode-0"], engines["decode-1"]
        args = ["--cb-failure-threshold", "3", "--cb-timeout-duration-secs", "600", "--retry-max-retries", "1",
                "--decode-policy", "round_robin", "--control-plane-api-keys", f"op:operator:admin:{KEY}"]
        with sim_engine.router(tmp_path, prefill, [hung, healthy], extra=args) as router:
            port = free_port()
            threading.Thread(target=router_ready.serve, args=("127.0.0.1", port, router.url,
                                                              f"http://127.0.0.1:{router.metrics_port}", KEY),
                             daemon=True).start()
            ready_url = f"http://127.0.0.1:{port}"
            headers = {"Authorization": f"Bearer {KEY}"}

            def listed() -> list[dict]:
                return list(httpx.get(router.url + "/workers", headers=headers, timeout=5).json()["workers"])
            sim_engine.until(lambda: len(listed()) == 3, time.monotonic() + 60, "the router lists its 3 workers")
            sim_engine.until(lambda: _ready(ready_url)[0] == 200, time.monotonic() + 30, "the sidecar says ready")

            hung.annotate(fault="hang")
            with concurrent.futures.ThreadPoolExecutor(24) as pool:
                answers: list[concurrent.futures.Future[int]] = []

                def held() -> bool:
                    # The fault starts within the simulator's 200 ms poll of its annotations: requests go on
                    # until round robin has left 3 with the hung engine (the circuit opens at 3, no retries here).
                    if len(answers) < 24:
                        answers.append(pool.submit(_generate, router.url))
                    return _active(router.metrics_port, hung.url) >= 3
                sim_engine.until(held, time.monotonic() + 30, "requests held by the hung engine", interval=0.2)
                hung.process.kill()
                codes = [a.result() for a in answers]
            assert 502 in codes, codes
            _, why = sim_engine.until(
                lambda: (a := _ready(ready_url))[0] == 503 and a, time.monotonic() + 30, "the sidecar says not ready")
            assert "no available prefill worker" in why
            assert httpx.get(router.url + "/readiness", timeout=5).status_code == 200  # the router's own: blind

            entry = next(w for w in listed() if w["worker_type"] == "prefill")
            httpx.delete(router.url + f"/workers/{entry['id']}", headers=headers, timeout=5).raise_for_status()
            sim_engine.until(lambda: all(w["url"] != prefill.url for w in listed()), time.monotonic() + 10,
                             "the prefill worker removed")
            httpx.post(router.url + "/workers", headers=headers, timeout=5, json={
                "url": prefill.url, "worker_type": "prefill", "bootstrap_port": prefill.bootstrap_port,
            }).raise_for_status()
            sim_engine.until(lambda: _ready(ready_url)[0] == 200, time.monotonic() + 30,
                             "the sidecar says ready once the prefill worker is registered again")
            assert _generate(router.url) == 200
