"""The engine simulator behind the real launcher: PD requests end to end, SGLang's surfaces, rank health
through the real agent and verdict, faults, and SIGTERM. Real processes on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.metadata
import json
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdfleet.runtime import drain, engine_flags
from pdfleet.runtime.health import ledger, procs, report, verdict
from tests.support import sim_engine
from tests.support.operator_process import free_port
from tests.support.sim_engine import SimEngine, until

POLICY = verdict.HealthPolicy.from_seconds(desync_after=0.5, hang_after=0.5)
FAKE_BOOTSTRAP = {"bootstrap_host": "2.2.2.2", "bootstrap_port": 1, "bootstrap_room": 0}
TTFT, ITL = "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"
# SGLang's tokenizer manager labels its latency histograms with these alone (its scheduler's gauges add the ranks).
TOKENIZER_LABELS = {"model_name", "engine_type"}
# Steps long enough that the ranks' and the event loop's own overheads do not blur a factor of 3.
LATENCY_TIMING = {"PDFLEET_SIM_DECODE_MS": "40", "PDFLEET_SIM_PREFILL_BASE_MS": "200"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SimEngine]]:
    """Every engine the module needs, started at once (each pays SGLang's import)."""
    tmp = tmp_path_factory.mktemp("sim")
    engines = {
        "prefill": sim_engine.start(tmp, "prefill", extra=["--disable-overlap-schedule"]),
        "decode": sim_engine.start(tmp, "decode"),
        "desync": sim_engine.start(tmp, "decode"),
        "dead": sim_engine.start(tmp, "prefill"),
        "slow-prefill": sim_engine.start(tmp, "prefill", tp=1, env={"PDFLEET_SIM_PREFILL_BASE_MS": "1500"}),
        "term": sim_engine.start(tmp, "decode", env={"PDFLEET_SIM_DECODE_MS": "20"}),
        "unified": sim_engine.start(tmp, "null", tp=1, env=LATENCY_TIMING),
        "slow": sim_engine.start(tmp, "null", tp=1, env={**LATENCY_TIMING, "PDFLEET_SIM_FAULT": "slow-requests",
                                                           "PDFLEET_SIM_LATENCY_FACTOR": "3"}),
        # One rank samples its own token; SGLang's sampler agrees the tokens only with the variable set.
        "unagreed": sim_engine.start(tmp, "null", tp=2, env={"PDFLEET_SIM_FAULT": "token-divergence"}),
        "agreed": sim_engine.start(tmp, "null", tp=2, env={"PDFLEET_SIM_FAULT": "token-divergence",
                                                            engine_flags.TOKEN_AGREEMENT_ENV: "1"}),
    }
    # Started with the others, checked by its own test: one more SGLang import in parallel, not in series.
    crashing = sim_engine.start(tmp, "decode", env={"PDFLEET_SIM_FAULT": "crash-at-start"})
    engines["crash"] = crashing
    try:
        deadline = time.monotonic() + sim_engine.STARTUP_S
        for name, engine in engines.items():
            if name != "crash":
                engine.wait_healthy(deadline)
        yield engines
    finally:
        for engine in engines.values():
            engine.terminate()  # all at once: each exit takes seconds
        for engine in engines.values():
            engine.stop()


def pd_bootstrap(prefill: SimEngine) -> dict[str, Any]:
    return {"bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.bootstrap_port,
            "bootstrap_room": random.getrandbits(63)}


def both(prefill: SimEngine, decode: SimEngine, path: str,
         body: dict[str, Any]) -> tuple[httpx.Response, httpx.Response]:
    """What sglang-router does: the same body, bootstrap fields added, to prefill and decode at once."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        p = pool.submit(httpx.post, prefill.url + path, json=body, timeout=30)
        d = pool.submit(httpx.post, decode.url + path, json=body, timeout=30)
        return p.result(), d.result()


def sse(text: str) -> list[Any]:
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def views(engine: SimEngine, expected: int = 2) -> list[verdict.RankView]:
    return report.rank_views([report.from_json(engine.ranks())], expected=range(expected))


def test_a_pd_generate_runs_end_to_end(fleet: dict[str, SimEngine]) -> None:
    prefill, decode = fleet["prefill"], fleet["decode"]
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 6}, **pd_bootstrap(prefill)}
    p, d = both(prefill, decode, "/generate", body)
    assert p.status_code == d.status_code == 200, (p.text, d.text)
    pj, dj = p.json(), d.json()
    assert len(dj["output_ids"]) == dj["meta_info"]["completion_tokens"] == 6
    assert dj["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert dj["meta_info"]["prompt_tokens"] == pj["meta_info"]["prompt_tokens"] == 5  # five words
    assert pj["output_ids"] == dj["output_ids"][:1]  # decode continues from the prefill's first token
    assert len(dj["text"].split()) == 6
    again = both(prefill, decode, "/generate", {**body, **pd_bootstrap(prefill)})[1].json()
    assert again["text"] == dj["text"]  # deterministic


def test_a_pd_generate_streams(fleet: dict[str, SimEngine]) -> None:
    prefill, decode = fleet["prefill"], fleet["decode"]
    body = {"text": "stream me", "stream": True, "sampling_params": {"max_new_tokens": 5}, **pd_bootstrap(prefill)}
    p, d = both(prefill, decode, "/generate", body)
    assert p.status_code == d.status_code == 200
    chunks = sse(d.text)
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert chunks[0]["meta_info"]["finish_reason"] is None
    assert len(sse(p.text)) == 1


def test_the_openai_client_talks_to_decode_with_bootstrap_fields(fleet: dict[str, SimEngine]) -> None:
    prefill, decode = fleet["prefill"], fleet["decode"]
    client = openai.OpenAI(base_url=decode.url + "/v1", api_key="none", timeout=30)
    messages = [{"role": "user", "content": "Say something simulated."}]
    for stream in (False, True):
        boot = pd_bootstrap(prefill)
        body = {"model": "sim-model", "messages": messages, "max_tokens": 7, "stream": stream, **boot}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            p = pool.submit(httpx.post, prefill.url + "/v1/chat/completions", json=body, timeout=30)
            if not stream:
                reply = client.chat.completions.create(model="sim-model", messages=messages, max_tokens=7,  # type: ignore[arg-type]
                                                       extra_body=boot)
                assert reply.usage is not None and reply.usage.completion_tokens == 7
                assert reply.usage.total_tokens == reply.usage.prompt_tokens + 7
                assert reply.choices[0].finish_reason == "length"
                assert len((reply.choices[0].message.content or "").split()) == 7
            else:
                chunks = list(client.chat.completions.create(
                    model="sim-model", messages=messages, max_tokens=7, stream=True,  # type: ignore[arg-type]
                    stream_options={"include_usage": True}, extra_body=boot))
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert len(text.split()) == 7
                assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
            assert p.result().status_code == 200
    assert [m.id for m in client.models.list()] == ["sim-model"]


def test_a_lost_prefill_fails_the_decode_side(fleet: dict[str, SimEngine]) -> None:
    body = {"text": "nobody prefills this", "bootstrap_host": "127.0.0.1", "bootstrap_port": free_port(),
            "bootstrap_room": random.getrandbits(63)}
    d = httpx.post(fleet["decode"].url + "/generate", json=body, timeout=30)
    assert d.status_code == 500
    assert "Decode handshake failed" in d.json()["detail"]


def test_a_pd_engine_refuses_a_request_without_bootstrap_but_stays_healthy(fleet: dict[str, SimEngine]) -> None:
    d = httpx.post(fleet["decode"].url + "/generate", json={"text": "hi"}, timeout=30)
    assert d.status_code == 400
    assert "without bootstrap room" in d.json()["error"]["message"]
    fake = httpx.post(fleet["decode"].url + "/generate", json={"input_ids": [0], **FAKE_BOOTSTRAP,
                                                               "sampling_params": {"max_new_tokens": 1}})
    assert fake.status_code == 200  # SGLang's own PD health probe: a fake bootstrap host
    assert httpx.get(fleet["decode"].url + "/health_generate").status_code == 200


def test_server_info_is_sglangs_resolved_arguments(fleet: dict[str, SimEngine]) -> None:
    prefill = httpx.get(fleet["prefill"].url + "/server_info", timeout=60).json()
    decode = httpx.get(fleet["decode"].url + "/get_server_info", timeout=60).json()
    assert prefill["tp_size"] == decode["tp_size"] == 2
    assert (prefill["disaggregation_mode"], decode["disaggregation_mode"]) == ("prefill", "decode")
    assert (prefill["disable_overlap_schedule"], decode["disable_overlap_schedule"]) == (True, False)
    assert prefill["disaggregation_bootstrap_port"] == fleet["prefill"].bootstrap_port
    assert prefill["model_path"] == "/models/sim" and prefill["served_model_name"] == "sim-model"
    assert prefill["version"] == importlib.metadata.version("sglang")
    assert "--disable-overlap-schedule" in prefill["launch_command"]
    assert len(prefill) > 400  # every ServerArgs field, as SGLang reports them
    model = httpx.get(fleet["decode"].url + "/model_info").json()
    assert model["served_model_name"] == "sim-model" and model["disaggregation_mode"] == "decode"


def test_every_rank_runs_the_loop_sglang_would_and_progresses(fleet: dict[str, SimEngine]) -> None:
    for name, loop in (("prefill", "event_loop_normal_disagg_prefill"),
                       ("decode", "event_loop_overlap_disagg_decode")):
        engine = fleet[name]
        first = engine.ranks()["ranks"]
        assert [(r["slot"], r["rank"], r["loop"], r["alive"]) for r in first] == [(0, 0, loop, True),
                                                                                   (1, 1, loop, True)]
        deadline = time.monotonic() + 10
        until(lambda e=engine, f=first: all(r["iteration"] > old["iteration"] + 2
                                             for r, old in zip(e.ranks()["ranks"], f, strict=True)),
              deadline, f"{name} ranks iterate")
        assert verdict.judge(views(engine), POLICY).health is verdict.Health.HEALTHY


def test_loads_are_what_the_drain_reads_and_metrics_use_sglang_names(fleet: dict[str, SimEngine]) -> None:
    loads = drain.fetch_loads(fleet["decode"].url)
    assert drain.in_flight(loads) == 0
    assert loads["loads"][0]["disaggregation"]["mode"] == "decode"
    assert {"num_running_reqs", "num_waiting_reqs", "max_running_requests"} <= set(loads["loads"][0])
    text = httpx.get(fleet["decode"].url + "/metrics").text
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_decode_transfer_queue_reqs"):
        assert f"\n{name}{{" in text
    # A counter with labels has no sample before its first request (this test may run first): its family is there.
    assert "\n# TYPE sglang:generation_tokens_total counter\n" in text


def test_the_metrics_port_relays_the_engines_metrics_and_nothing_else(fleet: dict[str, SimEngine]) -> None:
    """The launcher's relay in front of the simulator, as on every engine pod: SGLang's own families, and none of
    the engine's API."""
    engine = fleet["decode"]
    relayed = httpx.get(engine.metrics_url + "/metrics", timeout=10)
    direct = httpx.get(engine.url + "/metrics", timeout=10)
    assert relayed.status_code == 200 and relayed.headers["content-type"] == direct.headers["content-type"]
    names = {f.name for f in text_string_to_metric_families(relayed.text)}
    assert names == {f.name for f in text_string_to_metric_families(direct.text)}
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"} <= names
    for method, path in (("POST", "/flush_cache"), ("GET", "/flush_cache"), ("POST", "/generate"),
                         ("GET", "/server_info"), ("GET", "/v1/loads")):
        assert httpx.request(method, engine.metrics_url + path, timeout=10).status_code == 404, path
    assert httpx.post(engine.metrics_url + "/metrics", timeout=10).status_code == 405


def test_a_client_gone_mid_prefill_or_mid_transfer_leaves_nothing_in_flight(fleet: dict[str, SimEngine]) -> None:
    """The drain waits for /v1/loads to read zero: a request whose client went away must leave every queue it
    was in, or the engine's pod waits out its whole grace period when it is replaced."""
    engine = fleet["slow-prefill"]
    no_decode = {"bootstrap_host": "127.0.0.1", "bootstrap_port": free_port()}  # nobody takes the KV
    for gone_after in (0.3, 2.5):  # in the 1.5 s prefill forward; then waiting for the decode side
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(engine.url + "/generate", timeout=gone_after, json={
                "text": f"gone after {gone_after}", "bootstrap_room": random.getrandbits(63), **no_decode})
    until(lambda: drain.in_flight(drain.fetch_loads(engine.url)) == 0, time.monotonic() + 10,
          "the prefill engine's loads back to zero")
    assert httpx.get(engine.url + "/health").status_code == 200


def latencies(engine: SimEngine) -> dict[str, tuple[float, float]]:
    """TTFT's and ITL's (count, sum) on `engine`'s /metrics, over all their series; checks their shape."""
    text = httpx.get(engine.url + "/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    out = {}
    for name, own in ((TTFT, {"is_streaming"}), (ITL, set())):
        family = families[name]
        assert family.type == "histogram"
        count = total = 0.0
        for sample in family.samples:
            assert sample.name in (name + "_bucket", name + "_sum", name + "_count"), sample
            assert set(sample.labels) - {"le"} == TOKENIZER_LABELS | own, sample
            count += sample.value if sample.name == name + "_count" else 0.0
            total += sample.value if sample.name == name + "_sum" else 0.0
        out[name] = (count, total)
    return out


def grew(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """How many observations each histogram gained."""
    return {name: after[name][0] - before[name][0] for name in (TTFT, ITL)}


def mean_latencies(engine: SimEngine, requests: int, tokens: int) -> dict[str, float]:
    """Mean TTFT and ITL of `requests` new requests of `tokens` tokens each (streamed and not, in turn)."""
    before = latencies(engine)
    for n in range(requests):
        r = httpx.post(engine.url + "/generate", json={"text": f"request {n}", "stream": n % 2 == 1,
                                                        "sampling_params": {"max_new_tokens": tokens}}, timeout=30)
        assert r.status_code == 200, r.text
    after = latencies(engine)
    assert grew(before, after) == {TTFT: requests, ITL: (tokens - 1) * requests}
    return {name: (after[name][1] - before[name][1]) / (after[name][0] - before[name][0]) for name in (TTFT, ITL)}


def test_metrics_have_sglangs_latency_histograms_observed_where_the_tokens_are_made(
        fleet: dict[str, SimEngine]) -> None:
    prefill, decode = fleet["prefill"], fleet["decode"]
    before = {name: latencies(fleet[name]) for name in ("prefill", "decode")}
    for n in range(3):
        body = {"text": f"time me {n}", "stream": n == 1, "sampling_params": {"max_new_tokens": 5},
                **pd_bootstrap(prefill)}
        p, d = both(prefill, decode, "/generate", body)
        assert p.status_code == d.status_code == 200, (p.text, d.text)
    # The prefill side makes each request's first token, the decode side waits for it and makes the other four.
    assert grew(before["prefill"], latencies(prefill)) == {TTFT: 3, ITL: 0}
    assert grew(before["decode"], latencies(decode)) == {TTFT: 3, ITL: 12}


def test_slow_requests_show_in_the_latency_histograms(fleet: dict[str, SimEngine]) -> None:
    good, slow = mean_latencies(fleet["unified"], 3, 6), mean_latencies(fleet["slow"], 3, 6)
    assert slow[ITL] >= 2.5 * good[ITL], (good, slow)
    # Three times the 200 ms prefill, each plus up to one 40 ms rank iteration.
    assert slow[TTFT] >= 2 * good[TTFT], (good, slow)


def test_a_desync_is_judged_desync_while_health_says_200_and_requests_stall(fleet: dict[str, SimEngine]) -> None:
    engine = fleet["desync"]
    engine.annotate(fault="desync")
    deadline = time.monotonic() + 15
    found = until(lambda: (v := verdict.judge(views(engine), POLICY)).health is verdict.Health.DESYNC and v,
                  deadline, "a Desync verdict")
    phases = {v.rank: v.phase for v in found.ranks}
    assert phases == {0: verdict.phases.Phase.DECODE_TRANSFER_POLL, 1: verdict.phases.Phase.RECV_BROADCAST}
    assert httpx.get(engine.url + "/health").status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(engine.url + "/generate", json={"text": "stuck", **FAKE_BOOTSTRAP}, timeout=1.5)
    engine.annotate()  # permanent, as in production
    assert verdict.judge(views(engine), POLICY).health is verdict.Health.DESYNC


def test_a_rank_sampling_its_own_token_desyncs_its_group_unless_the_tokens_are_agreed(
        fleet: dict[str, SimEngine]) -> None:
    """The fault the operator's SYNC_TOKEN_IDS_ACROSS_TP (every group of tp > 1) exists for: without agreement the
    rank's next batch differs and the group desyncs; with it the same requests finish and the ranks stay in step."""
    agreed, unagreed = fleet["agreed"], fleet["unagreed"]
    for n in range(3):
        answer = httpx.post(agreed.url + "/generate", timeout=30,
                            json={"text": f"agreed {n}", "sampling_params": {"max_new_tokens": 8}})
        assert answer.status_code == 200
    with contextlib.suppress(httpx.ReadTimeout):  # the request that diverged may or may not finish first
        httpx.post(unagreed.url + "/generate", timeout=3,
                   json={"text": "diverges", "sampling_params": {"max_new_tokens": 8}})
    deadline = time.monotonic() + 15
    until(lambda: verdict.judge(views(unagreed), POLICY).health is verdict.Health.DESYNC, deadline,
          "a Desync verdict without token agreement")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(unagreed.url + "/generate", json={"text": "stuck"}, timeout=1.5)
    assert verdict.judge(views(agreed), POLICY).health is verdict.Health.HEALTHY
    assert httpx.post(agreed.url + "/generate", timeout=30, json={"text": "still serving"}).status_code == 200


def test_a_dead_rank_is_judged_dead(fleet: dict[str, SimEngine]) -> None:
    engine = fleet["dead"]
    engine.annotate(fault="dead-rank", fault_rank="0")
    deadline = time.monotonic() + 15
    found = until(lambda: (v := verdict.judge(views(engine), POLICY)).health is verdict.Health.DEAD and v,
                  deadline, "a Dead verdict")
    assert [v.rank for v in found.ranks if v.status is verdict.RankStatus.DEAD] == [0]


def test_sigterm_drains_in_flight_requests_then_exits_without_ranks(fleet: dict[str, SimEngine]) -> None:
    engine = fleet["term"]
    rank_pids = [r["pid"] for r in engine.ranks()["ranks"]]
    with concurrent.futures.ThreadPoolExecutor(1) as pool, httpx.Client(timeout=30) as client:
        body = {"text": "a long answer", "stream": True, "sampling_params": {"max_new_tokens": 60}, **FAKE_BOOTSTRAP}
        with client.stream("POST", engine.url + "/generate", json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            busy = drain.in_flight(drain.fetch_loads(engine.url))
            engine.process.send_signal(signal.SIGTERM)
            health = pool.submit(until, lambda: httpx.get(engine.url + "/health").status_code == 503,
                                 time.monotonic() + 5, "/health 503")
            rest = [line for line in lines if line.startswith("data: ")]
            health.result()
    assert busy == 1
    assert rest[-1] == "data: [DONE]"
    assert len(json.loads(rest[-2][len("data: "):])["output_ids"]) == 60
    assert engine.process.wait(30) == 0
    for pid in rank_pids:
        assert not Path(f"/proc/{pid}").exists(), f"rank {pid} left behind"
    # Every rank said goodbye in the ledger: a drained engine is Stopped, not Dead.
    with ledger.Ledger.open_readonly(engine.podinfo / "ledger") as led:
        ended = report.build(led.read_all(), now_ns=time.monotonic_ns(), ledger=str(led.path),
                             alive=lambda r: procs.is_alive(r.pid, r.pid_start))
    judged = verdict.judge(report.rank_views([ended], expected=range(2)), POLICY)
    assert (judged.health, judged.reason) == (verdict.Health.STOPPED, "ranks 0,1: exited cleanly")


def test_crash_at_start_exits_non_zero_with_a_message(fleet: dict[str, SimEngine]) -> None:
    engine = fleet["crash"]
    assert engine.process.wait(60) != 0
    assert "crash-at-start" in engine.log.read_text()


def test_a_straggler_reads_as_desync_while_it_stalls_then_the_group_recovers(fleet: dict[str, SimEngine]) -> None:
    engine = fleet["decode"]
    engine.annotate(fault="straggle", fault_rank="1", stall_ms="2000")
    deadline = time.monotonic() + 15
    found = until(lambda: (v := verdict.judge(views(engine), POLICY)).health is verdict.Health.DESYNC and v,
                  deadline, "a Desync verdict while rank 1 stalls")
    phases = {v.rank: v.phase for v in found.ranks}
    assert phases == {0: verdict.phases.Phase.DECODE_TRANSFER_POLL, 1: verdict.phases.Phase.LOCAL}
    until(lambda: verdict.judge(views(engine), POLICY).health is verdict.Health.HEALTHY, deadline,
          "Healthy again once the straggler caught up")
    engine.annotate()
