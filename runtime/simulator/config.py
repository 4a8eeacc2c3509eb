"""What a simulated engine is (from SGLang's parsed arguments) and how fast it pretends to be (from env).

Timing knobs, all optional (`PDFLEET_SIM_*`):

    PDFLEET_SIM_PREFILL_BASE_MS      fixed cost of one prefill forward (a batch)  (default 5)
    PDFLEET_SIM_PREFILL_TOKENS_PER_S  prefill throughput: a forward's prompt tokens  (default 50000)
                                     cost tokens / this on top of the base
    PDFLEET_SIM_MAX_PREFILL_TOKENS   prompt tokens one prefill forward takes at most (default: the
                                     --max-prefill-tokens given, else SGLang's 16384)
    PDFLEET_SIM_DECODE_MS            one decode step: a busy rank iteration      (default 10)
    PDFLEET_SIM_DECODE_TOKENS_PER_S  decode throughput shared by the running batch: a step of N running
                                     requests lasts at least N / this (default 0: no limit but the step)
    PDFLEET_SIM_IDLE_MS              one idle rank iteration                     (default 30)
    PDFLEET_SIM_MAX_RUNNING          running requests at most; more queue (FIFO) (default: the
                                     --max-running-requests given, else 64)
    PDFLEET_SIM_MAX_TOTAL_TOKENS     the KV pool: a request runs once it has room (default 262144)
                                     for its prompt and output; token_usage is a share of it
    PDFLEET_SIM_CONTEXT_LEN          context length, when --context-length is unset (default 32768)
    PDFLEET_SIM_KV_WAIT_S            how long either side of a PD transfer waits for the other (default 30)
    PDFLEET_SIM_DRAIN_S              on SIGTERM, how long in-flight requests may take (default 60)
    PDFLEET_SIM_LOAD_S               pretend model loading before serving        (default 0)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping

from pdfleet.runtime.engine_flags import TOKEN_AGREEMENT_ENV
from pdfleet.runtime.health import phases

ENV_PREFIX = "PDFLEET_SIM_"


def number(values: Mapping[str, str], key: str, default: float, *, low: float = 0.0,
           high: float | None = None) -> float:
    """`values[key]` as a number between `low` and `high`, `default` when unset. Raises ValueError naming it."""
    raw = values.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a number") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low:g} and {high:g}" if high is not None else \
            "not negative" if low == 0 else f"at least {low:g}"
        raise ValueError(f"{key}={raw!r} must be {bound}")
    return value


def _num(env: Mapping[str, str], name: str, default: float) -> float:
    return number(env, ENV_PREFIX + name, default)


@dataclasses.dataclass(frozen=True)
class Timing:
    prefill_base_s: float = 0.005
    prefill_tokens_per_s: float = 50000.0
    max_prefill_tokens: int = 16384
    decode_step_s: float = 0.010
    decode_tokens_per_s: float = 0.0  # 0: a step makes a token for every running request, however many
    idle_step_s: float = 0.030
    max_running: int = 64
    max_total_tokens: int = 262144
    context_len: int = 32768
    kv_wait_s: float = 30.0
    drain_s: float = 60.0
    load_s: float = 0.0

    def prefill_s(self, prompt_tokens: int) -> float:
        """One prefill forward of `prompt_tokens` prompt tokens (one prompt's, or a batch's)."""
        return self.prefill_base_s + prompt_tokens / self.prefill_tokens_per_s

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, max_running: int | None, context_len: int | None,
                 max_prefill_tokens: int | None = None) -> Timing:
        return cls(
            prefill_base_s=_num(env, "PREFILL_BASE_MS", 5) / 1000,
            prefill_tokens_per_s=number(env, ENV_PREFIX + "PREFILL_TOKENS_PER_S", 50000, low=1),
            max_prefill_tokens=max(1, int(_num(env, "MAX_PREFILL_TOKENS", max_prefill_tokens or 16384))),
            decode_step_s=_num(env, "DECODE_MS", 10) / 1000,
            decode_tokens_per_s=_num(env, "DECODE_TOKENS_PER_S", 0),
            # An idle iteration must stay well under the operator's desync threshold (seconds).
            idle_step_s=max(_num(env, "IDLE_MS", 30), 1) / 1000,
            max_running=max(1, int(_num(env, "MAX_RUNNING", max_running or 64))),
            max_total_tokens=int(_num(env, "MAX_TOTAL_TOKENS", 262144)),
            context_len=context_len or int(_num(env, "CONTEXT_LEN", 32768)),
            kv_wait_s=_num(env, "KV_WAIT_S", 30),
            drain_s=_num(env, "DRAIN_S", 60),
            load_s=_num(env, "LOAD_S", 0),
        )


def token_agreement(env: Mapping[str, str]) -> bool:
    """Whether SGLang's sampler reconciles sampled tokens across TP ranks in this environment: its own reading of
    the variable (`get_bool_env_var`: 'true' or '1')."""
    return env.get(TOKEN_AGREEMENT_ENV, "false").strip().lower() in ("true", "1")


@dataclasses.dataclass(frozen=True)
class Engine:
    """The facts of one engine process that shape what it serves and which loop its ranks run."""

    mode: str  # "null", "prefill" or "decode", as SGLang's --disaggregation-mode
    overlap: bool
    pp_size: int
    tp_size: int
    nnodes: int
    node_rank: int
    host: str
    port: int
    bootstrap_port: int
    model_path: str
    served_model_name: str
    transfer_backend: str
    dist_init_addr: str | None = None  # node rank 0's rendezvous (host:port) of a multi-node group
    token_agreement: bool = False  # SGLang's sampler reconciles sampled tokens across TP ranks (`token_agreement`)

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Engine:
        nnodes = max(1, int(getattr(args, "nnodes", 1) or 1))
        tp = int(args.tp_size)
        if tp % nnodes:
            raise ValueError(f"--tp-size {tp} is not divisible by --nnodes {nnodes}")
        return cls(
            mode=str(args.disaggregation_mode or "null"),
            overlap=not bool(args.disable_overlap_schedule),
            pp_size=int(getattr(args, "pp_size", 1) or 1),
            tp_size=tp,
            nnodes=nnodes,
            node_rank=int(getattr(args, "node_rank", 0) or 0),
            host=str(args.host),
            port=int(args.port),
            bootstrap_port=int(getattr(args, "disaggregation_bootstrap_port", 8998) or 8998),
            model_path=str(args.model_path),
            served_model_name=str(args.served_model_name or args.model_path),
            transfer_backend=str(getattr(args, "disaggregation_transfer_backend", "mooncake")),
            dist_init_addr=getattr(args, "dist_init_addr", None) or None,
            token_agreement=token_agreement(env if env is not None else os.environ),
        )

    @property
    def pd(self) -> bool:
        return self.mode in ("prefill", "decode")

    @property
    def local_ranks(self) -> int:
        return self.tp_size // self.nnodes

    @property
    def first_rank(self) -> int:
        return self.node_rank * self.local_ranks

    def loop(self, *, overlap: bool | None = None) -> phases.LoopName:
        """The loop SGLang's `_dispatch_event_loop_once` picks for these arguments (pdmux and MLX aside)."""
        kind = "pp" if self.pp_size > 1 else ("overlap" if (self.overlap if overlap is None else overlap)
                                             else "normal")
        suffix = {"prefill": "_disagg_prefill", "decode": "_disagg_decode"}.get(self.mode, "")
        return phases.LoopName.from_method(f"event_loop_{kind}{suffix}")

    def wrong_loop(self) -> phases.LoopName:
        """The loop the `wrong-event-loop` fault reports: the other of normal and overlap."""
        return self.loop(overlap=not self.overlap)
