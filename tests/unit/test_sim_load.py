"""The local fleet can be loaded: simulated engines with a small capacity queue requests, and their time to first
token and inter-token latency grow, as a real engine's do; /metrics says so under SGLang 0.5.23's own names,
labels and buckets (checked against SGLang's collector source); `pdfleet-sim load`'s ramp through the real
sglang-router in front of a simulated PD pair shows it per phase. Real processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdfleet.podrunner import loadgen
from pdfleet.podrunner.loadgen import Step
from tests.support import sglang_metrics, sim_engine
from tests.support.sim_engine import Router, SimEngine, until

TTFT, ITL = "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"
# What an autoscaler reads, and the brief's list: each must be served, and be SGLang's.
REQUIRED = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
            TTFT, ITL)
SLOTS = 4
# Unified: a step of 4 running lasts 4 / 100 = 40 ms, four times a lone request's 10 ms; a 50-token prompt's
# forward 5 + 100 ms.
UNIFIED = {"PDFLEET_SIM_DECODE_TOKENS_PER_S": "100", "PDFLEET_SIM_PREFILL_TOKENS_PER_S": "500"}
# The PD pair: about 150 / 9 = 16 prompts a second on prefill (the load's prompts are about 9 tokens), about
# 4 / (16 x 20 ms) = 12 answers a second on decode. The ramp's peak sends 25.
PREFILL = {"PDFLEET_SIM_PREFILL_TOKENS_PER_S": "150", "PDFLEET_SIM_PREFILL_BASE_MS": "20"}
DECODE = {"PDFLEET_SIM_DECODE_TOKENS_PER_S": "200"}
CAPACITY = ["--max-running-requests", str(SLOTS)]
# A KV pool of 200 tokens: two of the burst's requests (50 prompt + 40 output tokens each) fit, not three.
SMALL_KV = {**UNIFIED, "PDFLEET_SIM_MAX_TOTAL_TOKENS": "200"}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SimEngine]]:
    tmp = tmp_path_factory.mktemp("load")
    started = {"unified": sim_engine.start(tmp, "null", tp=1, extra=CAPACITY, env=UNIFIED),
               "prefill": sim_engine.start(tmp, "prefill", tp=1, extra=CAPACITY, env=PREFILL),
               "decode": sim_engine.start(tmp, "decode", tp=1, extra=CAPACITY, env=DECODE),
               "small-kv": sim_engine.start(tmp, "null", tp=1, extra=CAPACITY, env=SMALL_KV)}
    with sim_engine.serving(started):
        yield started


@pytest.fixture(scope="module")
def router(engines: dict[str, SimEngine], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    with sim_engine.router(tmp_path_factory.mktemp("router"), engines["prefill"], engines["decode"]) as r:
        yield r


def families(engine: SimEngine) -> dict[str, Any]:
    text = httpx.get(engine.url + "/metrics", timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def gauge(fams: dict[str, Any], name: str) -> float:
    return float(sum(s.value for s in fams[name].samples))


def histogram(fams: dict[str, Any], name: str) -> tuple[float, float]:
    """(count, sum) over every series."""
    samples = fams[name].samples
    return (sum(s.value for s in samples if s.name == name + "_count"),
            sum(s.value for s in samples if s.name == name + "_sum"))


def means(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Mean TTFT and ITL of what was observed between two readings."""
    out = {}
    for name in (TTFT, ITL):
        (n0, s0), (n1, s1) = histogram(before, name), histogram(after, name)
        assert n1 > n0, f"{name} observed nothing"
        out[name] = (s1 - s0) / (n1 - n0)
    return out


def generate(engine: SimEngine, n: int, tokens: int = 20, stream: bool = False) -> httpx.Response:
    return httpx.post(engine.url + "/generate", timeout=60, json={
        "text": " ".join(["word"] * 49 + [str(n)]), "stream": stream,
        "sampling_params": {"max_new_tokens": tokens}})


class Watch:
    """The highest value of each gauge on each engine while a load runs (read every 100 ms in a thread)."""

    def __init__(self, engines: dict[str, SimEngine], names: tuple[str, ...]) -> None:
        self.high: dict[tuple[str, str], float] = {}
        self._engines, self._names = engines, names
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for role, engine in self._engines.items():
                fams = families(engine)
                for name in self._names:
                    key = (role, name)
                    self.high[key] = max(self.high.get(key, 0.0), gauge(fams, name))

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_what_the_engines_serve_on_metrics_is_what_sglangs_collectors_declare(
        engines: dict[str, SimEngine]) -> None:
    """Every sglang: family: its name, type, label names and buckets as SGLang 0.5.23's scheduler and tokenizer
    manager collectors declare them; a name or label that drifts from SGLang's fails here."""
    declared = sglang_metrics.declared()
    for name in REQUIRED:
        assert name in declared, f"SGLang no longer declares {name}: the simulator's metric is not SGLang's"
    assert generate(engines["unified"], 0, tokens=3, stream=True).status_code == 200
    assert all(families(engines["unified"])[name].samples for name in (TTFT, ITL)), "the histograms observed"
    for role, engine in engines.items():
        fams = families(engine)
        served = {name for name in fams if name.startswith("sglang:")}
        assert set(REQUIRED) - {TTFT, ITL} <= served, role
        for name in sorted(served):
            family, want = fams[name], declared.get(name)
            assert want is not None, f"{role} serves {name}, which SGLang does not declare"
            assert family.type == want.kind, (role, name)
            for sample in family.samples:
                assert set(sample.labels) - {"le"} == want.labels, (role, name, sample.labels, want.labels)
            if want.kind == "histogram" and family.samples:  # a series appears with its first observation
                bounds = sorted({float(s.labels["le"]) for s in family.samples if s.name == name + "_bucket"})
                assert bounds == [*want.buckets, float("inf")], (role, name)  # type: ignore[misc]


def test_a_burst_beyond_the_slots_queues_and_ttft_itl_and_the_metrics_grow(engines: dict[str, SimEngine]) -> None:
    engine = engines["unified"]
    before = families(engine)
    assert generate(engine, 0).status_code == 200
    alone = means(before, families(engine))

    names = ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:gen_throughput")
    start = families(engine)
    with Watch({"unified": engine}, names) as watch, concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = [pool.submit(generate, engine, n) for n in range(1, 17)]
        assert all(a.result().status_code == 200 for a in answers), "requests beyond the slots wait, not refused"
    burst = means(start, families(engine))
    seen = {name: watch.high["unified", name] for name in names}
    assert seen["sglang:num_queue_reqs"] >= 4 and seen["sglang:num_running_reqs"] == SLOTS, seen
    assert 0 < seen["sglang:token_usage"] < 1 and seen["sglang:gen_throughput"] > 0, seen
    # Twelve wait behind four that each decode 20 tokens: time to first token is the wait; the batch of four
    # runs at 100 tokens a second, 40 ms a step against a lone request's 10.
    assert burst[TTFT] >= 3 * alone[TTFT], (alone, burst)
    assert burst[ITL] >= 2 * alone[ITL], (alone, burst)

    def idle() -> bool:
        fams = families(engine)
        return all(gauge(fams, n) == 0 for n in ("sglang:num_queue_reqs", "sglang:num_running_reqs",
                                                  "sglang:token_usage"))
    until(idle, time.monotonic() + 10, "queues and KV usage back to 0 after the burst")


def test_requests_wait_for_kv_room_and_token_usage_stays_within_the_pool(engines: dict[str, SimEngine]) -> None:
    engine = engines["small-kv"]
    names = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")
    with Watch({"kv": engine}, names) as watch, concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = [pool.submit(generate, engine, n, 40) for n in range(6)]
        assert all(a.result().status_code == 200 for a in answers)
    high = {name: watch.high["kv", name] for name in names}
    # Four slots, but room for two (50 + 40 tokens each of the 200): the others waited; the two running hold
    # 100-180 tokens.
    assert high["sglang:num_running_reqs"] == 2, high
    assert high["sglang:num_queue_reqs"] >= 3, high
    assert 0.5 <= high["sglang:token_usage"] <= 1, high


def test_requests_beyond_the_slots_wait_first_come_first_served(engines: dict[str, SimEngine]) -> None:
    engine = engines["unified"]
    first_token: dict[int, float] = {}

    def send(n: int, tokens: int) -> None:
        body = {"text": f"fifo {n}", "stream": True, "sampling_params": {"max_new_tokens": tokens}}
        with httpx.stream("POST", engine.url + "/generate", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and n not in first_token:
                    first_token[n] = time.monotonic()

    def count(name: str) -> float:
        return gauge(families(engine), name)

    shorts = range(SLOTS, SLOTS + 6)
    with concurrent.futures.ThreadPoolExecutor(SLOTS + 6) as pool:
        futures = []
        for n in range(SLOTS + 6):  # long ones to take every slot, then short ones, each sent once the last is in
            futures.append(pool.submit(send, n, 150 if n < SLOTS else 4))
            if n < SLOTS:
                until(lambda k=n: count("sglang:num_running_reqs") == k + 1, time.monotonic() + 10, f"{n} runs")
            else:
                until(lambda k=n: count("sglang:num_queue_reqs") == k - SLOTS + 1, time.monotonic() + 10,
                      f"{n} waits")
        for f in futures:
            f.result()
    # Each short one got a slot, and so its first token, in the order it came (those given a slot together
    # share a prefill forward, or forwards a few ms apart: the streams' threads may read them in either order).
    starts = [first_token[n] for n in shorts]
    assert all(a <= b + 0.05 for a, b in itertools.pairwise(starts)), starts


def test_a_ramp_through_the_router_queues_on_both_roles_and_each_phase_says_what_clients_saw(
        engines: dict[str, SimEngine], router: Router) -> None:
    pd = {role: engines[role] for role in ("prefill", "decode")}
    steps = [Step(2, 3), Step(25, 4), Step(2, 4)]
    names = ("sglang:num_queue_reqs", "sglang:num_decode_prealloc_queue_reqs", "sglang:num_running_reqs",
             "sglang:token_usage")
    load = loadgen.Load(router.url, model="sim-model", timeout_s=30)
    with Watch(pd, names) as watch:
        phases = asyncio.run(load.run_steps(steps))
    summaries = [p.summary() for p in phases]
    assert [s["sent"] for s in summaries] == [6, 100, 8], summaries
    assert all(s["failed"] == 0 and s["ok"] == s["sent"] for s in summaries), summaries
    quiet, peak = summaries[0], summaries[1]
    assert peak["p50_ms"] > 2 * quiet["p50_ms"], (quiet, peak)
    # Prefill makes about 16 first tokens a second and decode answers about 12: at 25 a second both fall behind.
    assert watch.high["prefill", "sglang:num_queue_reqs"] >= 1, watch.high
    assert watch.high["decode", "sglang:num_decode_prealloc_queue_reqs"] >= 1, watch.high
    assert watch.high["decode", "sglang:num_running_reqs"] == SLOTS, watch.high
    assert watch.high["prefill", "sglang:token_usage"] > 0 and watch.high["decode", "sglang:token_usage"] > 0
