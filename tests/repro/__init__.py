"""A real reproduction of the overlap-abort TP desync on CPU: `world` rank processes (any number from 2) on a
real gloo group, each running a loop shaped like SGLang's disaggregated decode loop through SGLang's own
scheduler and queue code.

- `scenario`: what one run does (arrivals, rank-local abort signals, patches), as plain JSON-able data.
- `stage`: the minimal SGLang objects a rank drives (a `Scheduler` and a `DecodeTransferQueue` built without
  their GPU-bound constructors) and the small fakes they need (a KV receiver, a request).
- `decode_loop`: one rank's loop, and the launcher that imports SGLang once and forks the ranks.
- `prefill`: the prefill loop (bootstrap and inflight polls) and its SGLang objects, for `role="prefill"`.
- `overhead`: the same loop with nothing diverging, switched between SGLang's functions and the patched ones
  block by block in the same ranks: the cost `make bench` reports (benchmarks/bench_desync_fixes.py).
- `group`: the test side: start a run in its own session, watch the ledger, judge it, kill everything.
"""
