"""What the engine says about itself: /server_info's resolved arguments, /model_info, /v1/loads, /metrics.

The arguments are SGLang's own: `prepare_server_args` on the engine's command line, then `resolve_once`, as
`run_server` would. Resolving reads the model's config; the simulator has no model on disk, so it resolves
with SGLang's own `dummy` model path (SGLang's model-independent handlers run, the model-dependent ones do
not) and reports the model path it was given. A real checkpoint directory, when present, resolves fully.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from pdfleet.runtime.simulator.config import Engine, Timing
from pdfleet.runtime.simulator.latency import Histogram

log = logging.getLogger(__name__)


def resolve_server_args(sglang_args: list[str]) -> dict[str, Any]:
    """SGLang's resolved arguments for this command line, as /server_info's fields (JSON-safe)."""
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

    args = prepare_server_args(sglang_args)
    given_model, given_tokenizer = args.model_path, args.tokenizer_path
    if not os.path.isfile(os.path.join(str(given_model), "config.json")):
        args.model_path = "dummy"  # SGLang's own short circuit for "no checkpoint to read"
    try:
        args.resolve_once()
    except Exception as e:
        log.warning("simulator: SGLang cannot resolve %s (%s); resolving with a dummy model", given_model, e)
        args = prepare_server_args(sglang_args)
        args.model_path = "dummy"
        args.resolve_once()
    resolved = dict(args.resolved_dict())
    resolved["model_path"] = given_model
    resolved["tokenizer_path"] = given_tokenizer or given_model
    resolved["served_model_name"] = resolved.get("served_model_name") or given_model
    resolved["launch_command"] = args.launch_command
    plain: dict[str, Any] = json.loads(json.dumps(msgspec_to_builtins(resolved), default=str))
    return plain


def sglang_version() -> str:
    from sglang.version import __version__

    return str(__version__)


def scheduler_info(timing: Timing, started: float) -> dict[str, Any]:
    return {"status": "ready", "max_total_num_tokens": timing.max_total_tokens,
            "max_req_input_len": timing.context_len - 1, "startup_time": started}


def model_info(engine: Engine, resolved: dict[str, Any]) -> dict[str, Any]:
    return {
        "model_path": engine.model_path,
        "served_model_name": engine.served_model_name,
        "tokenizer_path": resolved.get("tokenizer_path") or engine.model_path,
        "is_generation": True,
        "preferred_sampling_params": resolved.get("preferred_sampling_params"),
        "weight_version": resolved.get("weight_version", "default"),
        "load_format": resolved.get("load_format"),
        "reasoning_parser": resolved.get("reasoning_parser"),
        "tool_call_parser": resolved.get("tool_call_parser"),
        "disaggregation_mode": engine.mode,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
    }


def loads(engine: Engine, timing: Timing, queues: dict[str, int], used_tokens: int, include: set[str] | None,
          gen_throughput: float) -> dict[str, Any]:
    """/v1/loads, built with SGLang's own LoadSnapshot so the shape is SGLang's. Raises ValueError for a bad
    `include`, as SGLang does (it answers 400)."""
    from sglang.srt.managers.load_snapshot import DisaggregationMetrics, LoadSnapshot, QueueMetrics

    disagg = None
    if engine.pd:
        disagg = DisaggregationMetrics(
            mode=engine.mode,
            prefill_bootstrap_queue_reqs=queues["prefill_bootstrap"],
            prefill_inflight_queue_reqs=queues["prefill_inflight"],
            decode_prealloc_queue_reqs=queues["decode_prealloc"],
            decode_transfer_queue_reqs=queues["decode_transfer"],
        )
    snapshot = LoadSnapshot(
        timestamp=time.time(), dp_rank=0, num_running_reqs=queues["running"], num_waiting_reqs=queues["waiting"],
        num_used_tokens=used_tokens, num_total_tokens=used_tokens, num_active_tokens=used_tokens,
        max_total_num_tokens=timing.max_total_tokens, max_running_requests=timing.max_running,
        token_usage=used_tokens / timing.max_total_tokens, gen_throughput=gen_throughput,
        utilization=queues["running"] / timing.max_running, disaggregation=disagg,
        queues=QueueMetrics(waiting=queues["waiting"], grammar=0, paused=0, retracted=0, prealloc_ready=0),
    )
    return {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "version": sglang_version(),
        "accelerator": None,
        "num_accelerators": engine.tp_size * engine.pp_size,
        "loads": [snapshot.to_dict(include)],
    }


# name -> (type, SGLang's help text, collector). SGLang's scheduler labels its metrics with the engine's ranks, its
# tokenizer manager (request counts, tokens, latencies) with the model and engine type only.
SCHEDULER, TOKENIZER = "scheduler", "tokenizer"
METRICS: dict[str, tuple[str, str, str]] = {
    "num_running_reqs": ("gauge", "The number of running requests.", SCHEDULER),
    "num_queue_reqs": ("gauge", "The number of requests in the waiting queue.", SCHEDULER),
    "num_used_tokens": ("gauge", "The number of used tokens.", SCHEDULER),
    "token_usage": ("gauge", "The token usage.", SCHEDULER),
    "gen_throughput": ("gauge", "The generation throughput (token/s).", SCHEDULER),
    "num_prefill_bootstrap_queue_reqs": ("gauge", "The number of requests in the prefill bootstrap queue.",
                                         SCHEDULER),
    "num_prefill_inflight_queue_reqs": ("gauge", "The number of requests in the prefill inflight queue.", SCHEDULER),
    "num_decode_prealloc_queue_reqs": ("gauge", "The number of requests in the decode prealloc queue.", SCHEDULER),
    "num_decode_transfer_queue_reqs": ("gauge", "The number of requests in the decode transfer queue.", SCHEDULER),
    "context_len": ("gauge", "Maximum context length.", SCHEDULER),
    "num_transfer_failed_reqs_total": ("counter", "The number of transfer failed requests.", SCHEDULER),
    "num_requests_total": ("counter", "Number of requests processed.", TOKENIZER),
    "prompt_tokens_total": ("counter", "Number of prefill tokens processed.", TOKENIZER),
    "generation_tokens_total": ("counter", "Number of generation tokens processed.", TOKENIZER),
    "num_aborted_requests_total": ("counter", "Number of requests aborted.", TOKENIZER),
}


def metric_labels(engine: Engine) -> dict[str, str]:
    """Each collector's labels, as SGLang 0.5.23 sets them (no DP, no priority scheduling, no extra labels)."""
    tokenizer = f'model_name="{engine.served_model_name}",engine_type="{_engine_type(engine)}"'
    return {SCHEDULER: f'{tokenizer},tp_rank="0",pp_rank="0",moe_ep_rank="0"', TOKENIZER: tokenizer}


def metrics(engine: Engine, timing: Timing, queues: dict[str, int], totals: dict[str, int],
            streamed: dict[tuple[str, str], int], used_tokens: int, gen_throughput: float,
            histograms: tuple[Histogram, ...] = ()) -> str:
    """Prometheus text with SGLang's metric names, help and labels; `streamed`: requests and tokens per value of
    `is_streaming`; `histograms`: the tokenizer manager's latencies. `num_queue_reqs` is SGLang's waiting queue
    alone: a PD engine's bootstrap, prealloc, transfer and inflight queues have gauges of their own."""
    values: dict[str, float | dict[str, float]] = {
        "num_running_reqs": queues["running"],
        "num_queue_reqs": queues["waiting"],
        "num_used_tokens": used_tokens,
        "token_usage": used_tokens / timing.max_total_tokens,
        "gen_throughput": gen_throughput,
        "num_prefill_bootstrap_queue_reqs": queues["prefill_bootstrap"],
        "num_prefill_inflight_queue_reqs": queues["prefill_inflight"],
        "num_decode_prealloc_queue_reqs": queues["decode_prealloc"],
        "num_decode_transfer_queue_reqs": queues["decode_transfer"],
        "context_len": timing.context_len,
        "num_transfer_failed_reqs_total": totals.get("transfer_failed", 0),
        # A series per value of is_streaming seen, as prometheus_client's labelled counters appear.
        **{f"{what}_total": {label: float(n) for (w, label), n in sorted(streamed.items()) if w == what}
           for what in ("num_requests", "prompt_tokens", "generation_tokens")},
        "num_aborted_requests_total": totals.get("aborted", 0),
    }
    labels = metric_labels(engine)
    lines = []
    for name, value in values.items():
        kind, help_text, collector = METRICS[name]
        lines += [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} {kind}"]
        if isinstance(value, dict):
            lines += [f'sglang:{name}{{{labels[collector]},is_streaming="{label}"}} {n}' for label, n in value.items()]
        else:
            lines.append(f"sglang:{name}{{{labels[collector]}}} {float(value)}")
    for histogram in histograms:
        lines += histogram.render(labels[TOKENIZER])
    return "\n".join(lines) + "\n"


def _engine_type(engine: Engine) -> str:
    return {"prefill": "prefill", "decode": "decode"}.get(engine.mode, "unified")
