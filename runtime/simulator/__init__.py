"""The engine simulator: SGLang's HTTP server and scheduler, with only the GPU math replaced.

The launcher (`pdfleet.runtime.launcher`) calls `run(parsed, sglang_args, bind=...)` instead of SGLang's `run_server`
when `PDFLEET_ENGINE_MODE=simulate`, after everything else it does (SGLang's parser, patch checks, patches,
the rank-health agent, the metrics-only port that relays this simulator's /metrics). What runs then behaves like
SGLang on every surface pdfleet, sglang-router and clients touch: health, server and model info, /v1/loads,
/metrics, /generate and OpenAI chat completions, the requests pdfleet refuses on every engine
(/update_weights_from_disk, /add_external_corpus), PD disaggregation through a real bootstrap server, TP ranks as
processes that write the real rank ledger and meet in real cross-process collectives, faults on demand, SIGTERM
drain. See docs/local-fleet.md, "Engine simulator", for the interface.

Modules: `config` (engine facts, timing knobs), `faults` (what is asked, from annotations and env),
`ranks` (rank processes and collectives), `rendezvous` and `meeting` (a multi-node group's collectives across its
pods), `dns` (the pod's view of cluster DNS), `ticks` (rank iterations counted on the HTTP side), `scheduler`
(queues, timing model, PD hand-off), `latency` (TTFT and inter-token histograms), `kv` (bootstrap server and
KV fetch), `tokenizer`, `info`, `native_api`, `refused`, `openai_api`, `state`, `server` (lifetime).
"""

from __future__ import annotations

from pdfleet.runtime.simulator.server import run

__all__ = ["run"]
